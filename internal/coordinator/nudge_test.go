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
		urgent                  bool
	}{
		{"everyone near its share: nobody", []lease.Share{share("a", 10, 10, 10.5), share("b", 9.6, 9.6, 10)}, 0, 0, 0, nil, false},
		{"a newcomer below its share: the holder above shrinks", []lease.Share{share("a", 20, 20, 10), share("b", 0, 0, 10)}, 0, 0, 0, []string{"a"}, true},
		{"rate free: the newcomer takes it too", []lease.Share{share("a", 10, 20, 10), share("b", 0, 0, 10)}, 0, 10, 0, []string{"a", "b"}, true},
		{"largest excess first, only as many as the deficit needs", []lease.Share{
			share("small", 12, 12, 10), share("big", 30, 30, 10), share("new", 0, 0, 10)}, 0, 0, 0, []string{"big"}, true},
		{"an unconfirmed shrink counts as excess", []lease.Share{share("a", 10, 20, 10), share("b", 0, 0, 10)}, 0, 0, 0, []string{"a"}, true},
		{"over-committed (capacity fell): the holders above shrink", []lease.Share{share("a", 30, 30, 20)}, 0, -10, 0, []string{"a"}, true},
		{"a holder drifted a little below its share: not urgent", []lease.Share{share("a", 11.5, 11.5, 10), share("b", 8.5, 8.5, 10)}, 0, 0, 0, []string{"a"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, urgent := planNudges(tt.shares, tt.freeCap, tt.freeRate, tt.pool)
			if !slices.Equal(got, tt.want) || urgent != tt.urgent {
				t.Errorf("planNudges = %v, urgent %v; want %v, urgent %v", got, urgent, tt.want, tt.urgent)
			}
		})
	}
}

// A holder is nudged for a quota at most once per cooldown, unless the
// plan is urgent; what is held back says when it may go.
func TestDamper(t *testing.T) {
	cool := nudgeCooldown.Microseconds()
	var d Damper
	type step struct {
		at          int64
		quota       string
		holders     []string
		urgent      bool
		want        []string
		wantRetryAt int64
	}
	for i, st := range []step{
		{0, "q", []string{"a", "b"}, false, []string{"a", "b"}, 0},
		{cool / 2, "q", []string{"a", "c"}, false, []string{"c"}, cool},        // a held back until its cooldown ends
		{cool / 2, "p", []string{"a"}, false, []string{"a"}, 0},                // another quota: its own cooldown
		{cool / 2, "q", []string{"a", "b"}, true, []string{"a", "b"}, 0},       // urgent: at once
		{cool - 1, "q", []string{"a"}, false, nil, cool/2 + cool},              // since the urgent nudge
		{cool/2 + cool, "q", []string{"a", "b"}, false, []string{"a", "b"}, 0}, // cooled down
		{10 * cool, "q", nil, false, nil, 0},
	} {
		got, retryAt := d.Filter(st.quota, st.holders, st.urgent, st.at)
		if !slices.Equal(got, st.want) || retryAt != st.wantRetryAt {
			t.Errorf("step %d: Filter(%s, %v, urgent %v, at %d) = %v, retry at %d; want %v, %d", i, st.quota, st.holders, st.urgent, st.at, got, retryAt, st.want, st.wantRetryAt)
		}
	}
	// Old entries are forgotten (the map does not grow with every holder
	// ever nudged).
	d.Filter("r", []string{"z"}, false, 20*cool)
	if len(d.last) != 1 {
		t.Errorf("after the sweep the damper remembers %d nudges, want 1", len(d.last))
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
