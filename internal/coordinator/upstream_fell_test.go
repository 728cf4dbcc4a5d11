package coordinator

import "testing"

// A region's fall of demand is told upstream when its sum went well below
// what it last reported, also on a step that is not a halving: an agent's
// estimate reaches a new rate over several renewals (80 -> 53 -> 25 -> 14
// for a drop to 10/s), and a region that reported 25 must tell 14, or the
// global group keeps its share at 25 until the renew point.
func TestDemandFell(t *testing.T) {
	for _, tc := range []struct {
		name         string
		demand, sent float64
		want         bool
	}{
		{"the rest of a fall reported part of the way down", 14, 25, true},
		{"a halving", 10, 25, true},
		{"to nothing", 0, 80, true},
		{"a fall by a quarter", 59.9, 80, true},
		{"a fall by a fifth: noise, left to the renew point", 64, 80, false},
		{"steady", 25, 25, false},
		{"a rise", 40, 25, false},
		{"nothing reported yet", 5, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := demandFell(tc.demand, tc.sent); got != tc.want {
				t.Errorf("demandFell(%v, sent %v) = %v, want %v", tc.demand, tc.sent, got, tc.want)
			}
		})
	}
}
