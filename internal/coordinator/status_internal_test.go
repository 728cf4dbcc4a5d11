package coordinator

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/lease"
)

// TestStatusSampler holds the sampler to its bounds: at most statusCharted
// quotas charted, the busiest ones, statusHistory samples each (oldest
// first), a quota that leaves the state leaves the charts, and a chart
// never has more points than half its width.
func TestStatusSampler(t *testing.T) {
	n := &Node{cfg: DefaultConfig(), logger: slog.New(slog.DiscardHandler), clock: time.Now, fsm: NewFSM(nil, nil)}
	const quotas = statusCharted + 8
	now := time.Now().UnixMicro()
	n.fsm.read(func(st *lease.State) {
		for i := range quotas {
			// Quota i has demand i: the busiest are the last ones.
			_, err := st.Apply(lease.Grant{Now: now, Holder: fmt.Sprintf("agent-%d/1", i), Seq: 1,
				Quota: fmt.Sprintf("r|q%02d", i), Demand: float64(i),
				Config: &lease.QuotaConfig{Burst: 100, Rate: 1000, LeasePeriod: 3600e6}})
			if err != nil {
				t.Fatal(err)
			}
		}
	})
	start := time.Unix(1_800_000_000, 0)
	for i := range statusHistory + 50 {
		n.sampleOnce(start.Add(time.Duration(i) * time.Second))
	}
	n.status.mu.Lock()
	if got := len(n.status.series); got != statusCharted {
		t.Errorf("%d quotas charted, want %d", got, statusCharted)
	}
	for name, sr := range n.status.series {
		var i int
		fmt.Sscanf(name, "r|q%d", &i)
		if i < quotas-statusCharted {
			t.Errorf("quota %s (demand %d) charted, but %d busier ones exist", name, i, quotas-1-i)
		}
		h := sr.samples()
		if len(h) > statusHistory {
			t.Fatalf("%s holds %d samples, at most %d", name, len(h), statusHistory)
		}
		for k := 1; k < len(h); k++ {
			if h[k].at != h[k-1].at+1 {
				t.Fatalf("%s: samples not in order at %d: %d then %d", name, k, h[k-1].at, h[k].at)
			}
		}
		if last := h[len(h)-1].at; last != start.Unix()+statusHistory+49 {
			t.Errorf("%s: last sample at %d, want the latest", name, last)
		}
		c := chartOf(h)
		if pts := len(strings.Fields(c.Admitted)); pts > c.W/2+1 || pts < 2 {
			t.Errorf("%s: chart of %d samples has %d points, want 2 to %d", name, len(h), pts, c.W/2+1)
		}
	}
	n.status.mu.Unlock()

	// The busiest quota leaves the state: its chart goes with it.
	gone := fmt.Sprintf("r|q%02d", quotas-1)
	n.fsm.read(func(st *lease.State) {
		for _, l := range st.Leases(gone) {
			if _, err := st.Apply(lease.Release{Now: now, Holder: l.Holder, Seq: 2, LeaseID: l.ID}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := st.Apply(lease.Tick{Now: now + 7200e6}); err != nil {
			t.Fatal(err)
		}
		if _, ok := st.Quota(gone); ok {
			t.Fatalf("quota %s still in the state after release and tick: the test cannot check removal", gone)
		}
	})
	n.sampleOnce(start.Add(time.Hour))
	n.status.mu.Lock()
	defer n.status.mu.Unlock()
	if _, ok := n.status.series[gone]; ok {
		t.Errorf("%s left the state but is still charted", gone)
	}
}
