package holder_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
)

// A tenant of a default-share rule whose demand stays within its budget
// is never refused: its whole burst at once, then paced at 0.8 of the
// rule's rate, on one agent (its
// copy of the default lease and its own lease together hold the whole
// rate) and spread evenly over two (each agent's copy and own lease hold
// half). The second judge holds every refusal to an exact token bucket
// of the rule fed the tenant's admissions: none may be a refusal the
// budget held. The copy pays first and the own lease the rest; an agent
// that stopped spending the copy once the subject had a lease of its own
// left it (1-f) of its rate, and refused it while it was under budget.
func TestDefaultShareTenantWithinBudgetNotRefused(t *testing.T) {
	const yaml = `
rules:
  - name: tenant
    match: {user: "*"}
    burst: 20
    rate: 10
    mode: leased
    lease: {period: 5s, default_share: 0.5}
`
	for _, tc := range []struct {
		agents int
		burst  bool
	}{{1, true}, {2, false}} {
		agents := tc.agents
		t.Run(fmt.Sprintf("%d agents", agents), func(t *testing.T) {
			c := harness.StartCoordinators(t, 1, yaml)
			r := rule(t, yaml, "tenant")
			hs := make([]*holder.Leases, agents)
			for i := range hs {
				// A cold start far longer than a loaded machine's commit,
				// and a lease period (5s) no late renewal lapses: a
				// decision that fell to the failure policy would count as
				// a false refusal, and the split is what this is about.
				hs[i], _ = runHolder(t, c, holder.Options{Holder: fmt.Sprintf("a%d", i), ColdStart: 10 * time.Second})
			}
			rec := admission.NewRecorder()
			const quota = "tenant|user=t"
			const run = 5 * time.Second
			// First the whole burst at once, then 0.8 of the rate.
			perAgent := 0.8 * r.Rate / float64(agents)
			interval := time.Duration(float64(time.Second) / perAgent)
			first := 0
			if tc.burst {
				first = int(r.Burst)
			}
			n := first + int(perAgent*run.Seconds())
			var wg sync.WaitGroup
			start := time.Now()
			for i, h := range hs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for k := range n {
						if d := time.Until(start.Add(time.Duration(max(0, k-first)) * interval)); d > 0 {
							time.Sleep(d)
						}
						res, ok := h.Take(context.Background(), r, "user=t", 1, h.Now())
						if ok && res.Allowed {
							rec.Admit(fmt.Sprint(i), quota, 1)
						} else {
							rec.Deny(fmt.Sprint(i), quota, 1)
						}
					}
				}()
			}
			wg.Wait()
			rep := admission.Check(rec.Records(), quota, r.Burst, r.Rate)
			t.Logf("admitted %v of %d, refused %d, false refusals %d (at %v), overshoot %.3f",
				rep.Admitted, n*agents, rep.Refusals.Refused, rep.Refusals.False, rep.Refusals.At, rep.Overshoot)
			if rep.Overshoot > 1e-6 {
				t.Errorf("overshoot %.3f tokens in [%v, %v]", rep.Overshoot, rep.From, rep.To)
			}
			if rep.Refusals.False > 0 {
				t.Errorf("%d refusals of requests the tenant's budget held (at %v)", rep.Refusals.False, rep.Refusals.At)
			}
		})
	}
}

// A cost that neither the copy nor the own lease holds alone, but both
// together do, is admitted, paid by both; its refund gives each back its
// part. On the decision clock (microseconds), with one agent: the copy
// and the own lease hold 2 each, refilling 2/s each.
func TestDefaultShareCostSplitBetweenCopyAndOwnLease(t *testing.T) {
	const yaml = `
rules:
  - name: tenant
    match: {user: "*"}
    burst: 4
    rate: 4
    mode: leased
    lease: {period: 10s, default_share: 0.5}
`
	c := harness.StartCoordinators(t, 1, yaml)
	r := rule(t, yaml, "tenant")
	h := startHolder(t, c, "a")
	ctx := context.Background()
	t0 := h.Now()
	spend := func(at int64, cost float64) (bool, holder.Source) {
		t.Helper()
		res, src, ok := h.Spend(ctx, r, "user=t", cost, at)
		if !ok {
			t.Fatalf("spend of %v at +%dµs: no valid lease", cost, at-t0)
		}
		return res.Allowed, src
	}
	// Empty both: the copy's 2, then the own lease's 2 (its first grant).
	for i := range 4 {
		if ok, _ := spend(t0, 1); !ok {
			t.Fatalf("decision %d of the burst refused", i)
		}
	}
	// Drain both to under 0.1 together at one instant, after every grant
	// arrived; 300ms on, each holds 0.6 to 0.7: under 1 alone, over 1.2
	// together.
	tB := h.Now()
	for n := 0; ; n++ {
		if ok, _ := spend(tB, 0.1); !ok {
			break
		}
		if n > 100 {
			t.Fatal("40 tokens spent from parts of 2 each")
		}
	}
	t1 := tB + 300_000
	ok, src := spend(t1, 1)
	if !ok {
		t.Fatalf("a cost of 1 refused with 0.6 in the copy and 0.6 in the own lease")
	}
	h.Refund(src, 1)
	// Each part back: the copy alone pays what it had given.
	if ok, src := spend(t1, 0.5); !ok || !src.Shared() {
		t.Fatalf("after the refund a cost of 0.5 was admitted %v, from the copy %v: want the copy to hold its part again", ok, src.Shared())
	}
}
