package coordinator

import (
	"slices"
	"testing"

	"github.com/ration-dev/ration/internal/lease"
)

func TestPlanNudges(t *testing.T) {
	share := func(h string, rate, resRate, target float64) lease.Share {
		return lease.Share{Holder: h, Rate: rate, ResRate: resRate, TargetRate: target, Cap: rate, ResCap: resRate, TargetCap: target}
	}
	tests := []struct {
		name                    string
		shares                  []lease.Share
		freeCap, freeRate, pool float64
		want                    []string
	}{
		{"everyone near its share: nobody", []lease.Share{share("a", 10, 10, 10.5), share("b", 9.6, 9.6, 10)}, 0, 0, 0, nil},
		{"a newcomer below its share: the holder above shrinks", []lease.Share{share("a", 20, 20, 10), share("b", 0, 0, 10)}, 0, 0, 0, []string{"a"}},
		{"rate free: the newcomer takes it too", []lease.Share{share("a", 10, 20, 10), share("b", 0, 0, 10)}, 0, 10, 0, []string{"a", "b"}},
		{"largest excess first, only as many as the deficit needs", []lease.Share{
			share("small", 12, 12, 10), share("big", 30, 30, 10), share("new", 0, 0, 10)}, 0, 0, 0, []string{"big"}},
		{"an unconfirmed shrink counts as excess", []lease.Share{share("a", 10, 20, 10), share("b", 0, 0, 10)}, 0, 0, 0, []string{"a"}},
		{"over-committed (capacity fell): the holders above shrink", []lease.Share{share("a", 30, 30, 20)}, 0, -10, 0, []string{"a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := planNudges(tt.shares, tt.freeCap, tt.freeRate, tt.pool)
			if !slices.Equal(got, tt.want) {
				t.Errorf("planNudges = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSplitHolder(t *testing.T) {
	tests := []struct {
		in      string
		id, inc string
		ok      bool
	}{
		{"agent-1/00ff", "agent-1", "00ff", true},
		{"a/b/c", "a/b", "c", true},
		{"region/eu", "", "", false},
		{"host", "", "", false},
		{"/x", "", "", false},
		{"x/", "", "", false},
	}
	for _, tt := range tests {
		id, inc, ok := splitHolder(tt.in)
		if id != tt.id || inc != tt.inc || ok != tt.ok {
			t.Errorf("splitHolder(%q) = %q, %q, %v; want %q, %q, %v", tt.in, id, inc, ok, tt.id, tt.inc, tt.ok)
		}
	}
}
