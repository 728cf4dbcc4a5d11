package holder_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// retryOnce sends the first Renew that carries a grant twice, as the
// coordinator client does when an attempt outlives its timeout (a Raft
// entry of a thousand grants on a loaded coordinator), and hands back the
// second answer: the retry's, answered from the record, where every grant
// but the last command's is lost.
type retryOnce struct {
	*coordinator.Client
	done    atomic.Bool
	retried atomic.Int64 // grants answered as lost on retry
}

func (c *retryOnce) Renew(ctx context.Context, req *rationv1.RenewRequest) (*rationv1.RenewResponse, error) {
	grant := false
	for _, it := range req.Items {
		grant = grant || it.LeaseId == 0
	}
	if !grant || c.done.Load() {
		return c.Client.Renew(ctx, req)
	}
	c.done.Store(true)
	if _, err := c.Client.Renew(ctx, req); err != nil {
		return nil, err
	}
	resp, err := c.Client.Renew(ctx, req)
	for _, g := range resp.GetGrants() {
		if g.Error == coordinator.ItemErrRetryGrant {
			c.retried.Add(1)
		}
	}
	return resp, err
}

// A first grant whose answer is lost on a retry (the lease exists at the
// coordinator, its terms are not in the replayed answer) is asked for again
// at once, and the decisions that wait for it keep waiting within their
// cold start: they are decided on the lease, never by the failure policy,
// on a coordinator that answers every request. (Marked answered, its
// decisions fell to the failure policy at once: with 4 callers sending
// batches of 1,000 fresh subjects to one agent on a loaded machine, a
// request's 1,000 first decisions at a time.)
func TestFirstGrantLostOnRetryStillWaited(t *testing.T) {
	c := harness.StartCoordinators(t, 1, leasedRules)
	r := rule(t, leasedRules, "hot")
	var via *retryOnce
	h, _ := runHolderVia(t, c, holder.Options{Holder: "a"}, func(cl *coordinator.Client) holder.Client {
		via = &retryOnce{Client: cl}
		return via
	})
	ctx := context.Background()
	// Two subjects in one request: the replay answers the last command
	// (the second grant) and loses the first.
	h.Prepare(r, "k=1")
	h.Prepare(r, "k=2")
	for _, s := range []string{"k=1", "k=2"} {
		// Decided on its lease: admitted, or refused when it is the lost
		// grant's lease, whose first balance is forfeit (the replay does
		// not carry it); never left to the failure policy.
		if _, ok := h.Take(ctx, r, s, 1, h.Now()); !ok {
			t.Fatalf("first decision of %s fell to the failure policy (grants lost on retry: %d)", s, via.retried.Load())
		}
	}
	if via.retried.Load() == 0 {
		t.Fatal("no grant was answered as lost on retry: the test did not test it")
	}
}
