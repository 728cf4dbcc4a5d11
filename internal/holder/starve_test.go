package holder_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// slowLink runs before ahead of every Renew: the test's hook into the
// moment a request leaves.
type slowLink struct {
	holder.Client
	before func()
}

func (s slowLink) Renew(ctx context.Context, req *rationv1.RenewRequest) (*rationv1.RenewResponse, error) {
	s.before()
	return s.Client.Renew(ctx, req)
}

// A flood of new subjects does not hold back the renewal of a lease in
// use. 200 first grants go out 10 items a request, each request taking
// 40 ms of the holder's clock (a starved coordinator), while a subject's
// lease of a 1 s period (valid about 950 ms, renewed at half) is due:
// its renewal rides in the first request and the lease never stops being
// valid. Sent after every grant, it left 20 requests (800 ms) later, after
// the lease had expired, and that subject's decisions fell to the failure
// policy meanwhile.
func TestRenewalsNotHeldBackByGrants(t *testing.T) {
	c := harness.StartCoordinators(t, 1, leasedRules)
	r := rule(t, leasedRules, "hot")
	var now atomic.Int64 // the holder's clock, µs
	now.Store(int64(time.Second / time.Microsecond))
	var h *holder.Leases
	var sent, lapsed atomic.Int64
	client := coordinator.NewClient(c.GRPCAddrs(), coordinator.ClientOptions{CallTimeout: 5 * time.Second, MaxAttempts: 3})
	t.Cleanup(func() { client.Close() })
	h, err := holder.New(holder.Options{
		Holder: "a", MaxItems: 10, Logger: logger(t), RequestTimeout: 10 * time.Second,
		Clock: now.Load,
		Client: slowLink{Client: client, before: func() {
			sent.Add(1)
			if _, _, valid := h.Share("hot", "k=old"); !valid {
				lapsed.Add(1)
			}
			now.Add(40_000)
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h.Prepare(r, "k=old")
	h.Round(ctx)
	if _, _, valid := h.Share("hot", "k=old"); !valid {
		t.Fatal("the first grant of k=old was not adopted")
	}
	lapsed.Store(0) // the check before its own grant
	// Past its renew point, before it expires: due now.
	now.Add(500_000)
	const fresh = 200
	for i := range fresh {
		h.Prepare(r, fmt.Sprintf("k=%d", i))
	}
	before := sent.Load()
	h.Round(ctx)
	if n := sent.Load() - before; n < fresh/10 {
		t.Fatalf("the round sent %d requests, want at least %d (every grant, 10 a request)", n, fresh/10)
	}
	if n := lapsed.Load(); n > 0 {
		t.Errorf("the lease of k=old was not valid when %d of the round's requests left: its renewal waited behind the grants", n)
	}
	for i := range fresh {
		if _, _, valid := h.Share("hot", fmt.Sprintf("k=%d", i)); !valid {
			t.Errorf("k=%d: no valid lease after the round", i)
		}
	}
}
