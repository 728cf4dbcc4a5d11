package coordinator_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
)

// TestRenewCostIndependentOfHolders holds the leader's work per renewal
// to a constant, whatever the number of holders of the renewed quota
// (a coordinator that keeps up): the nudge plan, which reads every live lease of a quota, is
// made once per quota per planning round (nudge.go), not once per
// renewal. At 10 and at 1,000 holders of one quota, every holder renews
// in turn (32 at a time, 3,000 renewals in all, within a minute); the leases the leader's
// plans read (a test hook) must stay within what the planner's pacing
// allows for the time the renewals took: at most one plan per
// max(PlanMin, holders*PlanPerLease), each reading the quota's holders,
// plus one plan already due. So the leases read per second are bounded
// independently of the number of holders, and a renewal costs the leader
// nothing of them on its way out. The code before (a plan per renewal)
// read holders leases per renewal: about 3,000 x 1,000 at 1,000 holders,
// far above the bound.
func TestRenewCostIndependentOfHolders(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node group and 1,000 holders")
	}
	for _, holders := range []int{10, 1000} {
		t.Run(fmt.Sprintf("holders=%d", holders), func(t *testing.T) {
			c := harness.StartCoordinators(t, 3, scaleRules)
			li, _ := c.Leader(t)
			leader := c.Node(li)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			clients := make([]*coordinator.Client, min(holders, 8))
			for i := range clients {
				clients[i] = c.Client(coordinator.ClientOptions{})
			}
			quotas := benchQuotas(holders, true)
			hs := startHolders(t, ctx, clients, quotas, 64)

			const renewals = 3000
			before := leader.LeasesVisited()
			start := time.Now()
			var next, done atomic.Int64
			var firstErr atomic.Value
			var wg sync.WaitGroup
			// workers renew concurrently, each its own holders in turn (a
			// holder's requests are sequential): the load of 32 holders in a
			// closed loop, so that the group keeps its leader under -race.
			const workers = 32
			for w := range min(workers, len(hs)) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; next.Add(1) <= renewals && ctx.Err() == nil; i += workers {
						if i >= len(hs) {
							i = w
						}
						req := hs[i].request(quotas[i], 1)
						resp, err := clients[i%len(clients)].Renew(ctx, req)
						if err == nil {
							err = hs[i].adopt(req, resp)
						}
						if err != nil {
							firstErr.CompareAndSwap(nil, err)
							return
						}
						done.Add(1)
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			if err := firstErr.Load(); err != nil {
				t.Fatal(err)
			}
			// What was planned after the last renewal is counted too.
			time.Sleep(2 * max(coordinator.PlanMin, time.Duration(holders)*coordinator.PlanPerLease))
			visited := leader.LeasesVisited() - before
			interval := max(coordinator.PlanMin, time.Duration(holders)*coordinator.PlanPerLease)
			plans := 3 + int64(elapsed/interval)
			limit := plans * int64(holders)
			t.Logf("%d holders: %d renewals in %v, %d leases read by nudge plans (%.2f per renewal), at most %d allowed",
				holders, done.Load(), elapsed.Round(time.Millisecond), visited, float64(visited)/float64(done.Load()), limit)
			if visited > limit {
				t.Errorf("nudge plans read %d leases for %d renewals of %d holders in %v, more than one plan per %v allows (%d): the plan runs per renewal?",
					visited, done.Load(), holders, elapsed, interval, limit)
			}
			if done.Load() < renewals {
				t.Errorf("%d renewals of %d done", done.Load(), renewals)
			}
		})
	}
}
