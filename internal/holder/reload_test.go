package holder_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// A rules reload that changes lease.default_share while leases are live
// moves size from one part of every subject's budget to the other. The
// part that shrinks stays reserved at its old size until its holders
// confirm or their terms end; the part that grows must not grow into that
// meanwhile, or a subject gets max(f) + max(1-f) of its rule. Agent a
// holds both parts of subject x, full, and is cut off at the reload, so
// its leases keep their old sizes to the end of their terms; agent b
// arrives after the reload and leases under the new shares. Both then
// spend x flat out, and its admissions stay within B + r*T, B and r
// unchanged.
func TestDefaultShareReloadHoldsTheSum(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to float64
	}{
		{"default part grows", 0.5, 0.9},
		{"own part grows", 0.9, 0.5},
		{"default share turned on", 0, 0.5},
		{"default share turned off", 0.5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) { reloadShare(t, tc.from, tc.to) })
	}
}

func reloadShare(t *testing.T, from, to float64) {
	// r = B per second: the parts refill within a second, and the final
	// burst of spending takes milliseconds, so r*T adds almost nothing
	// to B in its window.
	yaml := func(f float64) string {
		return fmt.Sprintf(`
rules:
  - name: split
    match: {user: "*"}
    burst: 100
    rate: 100
    mode: leased
    lease: {default_share: %v}
`, f)
	}
	c := harness.StartCoordinators(t, 1, yaml(from))
	r1, r2 := rule(t, yaml(from), "split"), rule(t, yaml(to), "split")
	rec := admission.NewRecorder()
	var link *cuttable
	a, _ := runHolderVia(t, c, holder.Options{Holder: "a"}, func(cl *coordinator.Client) holder.Client {
		link = &cuttable{Client: cl}
		return link
	})
	// a spends x's copy dry, so that x has its own lease too (or, with
	// no default share, only its own lease); both then refill to full.
	drain(t, rec, r1, "user=x", 300*time.Millisecond, a)
	if _, _, ok := a.Share(r1.Name, "user=x"); !ok {
		t.Fatal("x has no own lease at a after its copy ran dry")
	}
	time.Sleep(1500 * time.Millisecond)

	set, err := rules.Parse("rules.yaml", []byte(yaml(to)))
	if err != nil {
		t.Fatal(err)
	}
	link.cut.Store(true)
	for _, i := range c.Live() {
		c.Node(i).SetRules(set)
	}
	b := startHolder(t, c, "b")
	// b's first decision of x leases what the new shares let it: its
	// copy of the default lease and, with that dry, x's own lease.
	res, _, ok := b.Spend(context.Background(), r2, "user=x", 1, b.Now())
	if !ok {
		t.Fatal("b holds no lease of the rule after the reload")
	}
	if res.Allowed {
		rec.Admit("b", "split|user=x", 1)
	}
	time.Sleep(1500 * time.Millisecond) // b's leases refill
	var parts []string
	for _, l := range listLeasesOf(t, c) {
		parts = append(parts, fmt.Sprintf("%s %s cap %.1f", strings.SplitN(l.Holder, "/", 2)[0], l.Quota, l.Cap))
	}
	t.Logf("leases before the final burst: %s", strings.Join(parts, "; "))
	// a still spends under its old terms (rule r1, as its last answers
	// say), b under the new ones.
	var wg sync.WaitGroup
	for id, h := range map[string]*holder.Leases{"a": a, "b": b} {
		r := r2
		if id == "a" {
			r = r1
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				res, _, ok := h.Spend(context.Background(), r, "user=x", 1, h.Now())
				if !ok || !res.Allowed {
					return
				}
				rec.Admit(id, "split|user=x", 1)
			}
		}()
	}
	wg.Wait()
	checkBound(t, rec, r2, "user=x")
}

func listLeasesOf(t *testing.T, c *harness.Coordinators) []*rationv1.LeaseStatus {
	t.Helper()
	_, leader := c.Leader(t)
	return listLeases(t, leader.AdminAddr())
}
