package holder_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// cuttable is a real coordinator client whose link can be cut: while cut,
// every call fails at once, as through a partition.
type cuttable struct {
	holder.Client
	cut atomic.Bool
}

var errCut = errors.New("link cut")

func (c *cuttable) Renew(ctx context.Context, req *rationv1.RenewRequest) (*rationv1.RenewResponse, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	return c.Client.Renew(ctx, req)
}

func (c *cuttable) Release(ctx context.Context, req *rationv1.ReleaseRequest) (*rationv1.ReleaseResponse, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	return c.Client.Release(ctx, req)
}

// A refund that arrives after the lease its tokens came from was lost
// (cut off past its expiry, reclaimed, granted again) is dropped: landing
// in the new lease, it added tokens the coordinator never gave, on top of
// a new grant the pool had refilled, and the subject was admitted about
// 2B in a window of a few milliseconds. For a subject's own lease and for
// its copy of the rule's default lease.
func TestRefundAfterRegrantDropped(t *testing.T) {
	const yaml = `
rules:
  - name: own
    match: {user: "*"}
    burst: 10
    rate: 10
    mode: leased
    lease: {period: 1s}
  - name: copy
    match: {user: "*"}
    burst: 10
    rate: 10
    mode: leased
    lease: {period: 1s, default_share: 1}
`
	for _, tc := range []struct {
		rule, leased string // the rule, and the subject whose lease is spent
	}{{"own", "user=x"}, {"copy", rules.DefaultSubject}} {
		t.Run(tc.rule, func(t *testing.T) {
			c := harness.StartCoordinators(t, 1, yaml)
			r := rule(t, yaml, tc.rule)
			rec := admission.NewRecorder()
			var link *cuttable
			h, _ := runHolderVia(t, c, holder.Options{Holder: "a"}, func(cl *coordinator.Client) holder.Client {
				link = &cuttable{Client: cl}
				return link
			})
			ctx := context.Background()
			// A request takes the whole bucket and is then denied by
			// another rule: its refund is pending.
			res, src, ok := h.Spend(ctx, r, "user=x", r.Burst, h.Now())
			if !ok || !res.Allowed {
				t.Fatalf("first decision: ok %v, allowed %v", ok, res.Allowed)
			}
			_, leader := c.Leader(t)
			first := listLeases(t, leader.AdminAddr())
			link.cut.Store(true)
			waitFor(t, "the coordinator to reclaim the cut-off lease", 15*time.Second, func() bool {
				return len(listLeases(t, leader.AdminAddr())) == 0
			})
			link.cut.Store(false)
			waitFor(t, "a new lease", 15*time.Second, func() bool {
				_, _, valid := h.Share(r.Name, tc.leased)
				return valid
			})
			again := listLeases(t, leader.AdminAddr())
			if len(first) != 1 || len(again) != 1 || first[0].LeaseId == again[0].LeaseId {
				t.Fatalf("leases before the cut %v, after %v: want one, granted anew", first, again)
			}
			n := drain(t, rec, r, "user=x", 200*time.Millisecond, h)
			h.Refund(src, r.Burst)
			m := drain(t, rec, r, "user=x", 200*time.Millisecond, h)
			t.Logf("admitted %d from the new lease, then %d after the refund of the old one's %v", n, m, r.Burst)
			checkBound(t, rec, r, "user=x")
		})
	}
}

// waitFor polls cond until it holds or limit passes.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", limit, what)
		}
	}
}
