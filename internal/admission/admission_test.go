package admission

import (
	"math"
	"testing"
	"time"
)

func at(ms int) time.Duration { return time.Duration(ms) * time.Millisecond }

func TestCheck(t *testing.T) {
	tests := []struct {
		name      string
		recs      []Record
		burst     float64
		rate      float64
		overshoot float64 // want, within 1e-9
		from, to  time.Duration
	}{
		{
			name:  "burst exactly",
			recs:  []Record{{At: 0, Cost: 5}, {At: 0, Cost: 5}},
			burst: 10, rate: 1, overshoot: 0, to: 0,
		},
		{
			name:  "one over the burst at once",
			recs:  []Record{{At: 0, Cost: 6}, {At: 0, Cost: 5}},
			burst: 10, rate: 1, overshoot: 1,
		},
		{
			name: "refill admits more over time",
			// 10 at t=0, then 1 per second: exactly at the bound.
			recs:  []Record{{At: 0, Cost: 10}, {At: at(1000), Cost: 1}, {At: at(2000), Cost: 1}},
			burst: 10, rate: 1, overshoot: 0, to: at(1000),
		},
		{
			name: "too fast after the burst is caught in a middle window",
			// A long quiet start would hide this in the total: 100s of
			// silence, then 10 + 3 within one second.
			recs:  []Record{{At: 0, Cost: 1}, {At: at(100000), Cost: 10}, {At: at(101000), Cost: 3}},
			burst: 10, rate: 1, overshoot: 2, from: at(100000), to: at(101000),
		},
		{
			name:  "rate zero never refills",
			recs:  []Record{{At: 0, Cost: 3}, {At: at(100000), Cost: 3}},
			burst: 5, rate: 0, overshoot: 1, from: 0, to: at(100000),
		},
		{
			name:  "other quotas are ignored",
			recs:  []Record{{At: 0, Cost: 10}, {At: 0, Cost: 100, Quota: "other"}},
			burst: 10, rate: 0, overshoot: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := Check(allowed(tt.recs), "", tt.burst, tt.rate)
			if math.Abs(rep.Overshoot-tt.overshoot) > 1e-9 {
				t.Fatalf("Overshoot = %v, want %v (report %+v)", rep.Overshoot, tt.overshoot, rep)
			}
			if tt.overshoot > 0 && (rep.From != tt.from || rep.To != tt.to) {
				t.Fatalf("window = [%v, %v], want [%v, %v]", rep.From, rep.To, tt.from, tt.to)
			}
		})
	}
}

func TestUtilisationAndRecorder(t *testing.T) {
	r := NewRecorder()
	r.Admit("a", "q", 4)
	r.Admit("b", "q", 6)
	recs := r.Records()
	if len(recs) != 2 || recs[0].At > recs[1].At {
		t.Fatalf("Records() = %+v, want 2 in time order", recs)
	}
	rep := Check(recs, "q", 10, 0)
	if rep.Admitted != 10 || rep.Utilisation != 1 || rep.Overshoot != 0 {
		t.Fatalf("report = %+v, want admitted 10, utilisation 1, overshoot 0", rep)
	}
}

// allowed marks hand-made records as admissions.
func allowed(recs []Record) []Record {
	for i := range recs {
		recs[i].Allowed = true
	}
	return recs
}
