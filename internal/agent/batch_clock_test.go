package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

const batchClockRules = `
rules:
  - name: q
    match: {tenant: "*"}
    burst: 10
    rate: 0.01
    mode: leased
    lease: {period: 1s}
    on_failure: fail_closed
`

// A batch item that waits for a new subject's first grant (up to the
// decision timeout) must not leave the items after it checked against the
// clock read before the wait: they would spend a lease that expired
// meanwhile, after the coordinator reclaimed it and may have granted its
// tokens to another agent. A real agent holds a 1s lease of tenant=held;
// the link to a real coordinator then hangs (a stalled proxy: calls get no
// answer and no error), and a batch asks first for a new tenant, whose
// first grant never comes (it waits out the 2s decision timeout), then
// for tenant=held. By then held's lease has expired: every held item
// falls to fail_closed, none is admitted.
func TestBatchItemsAfterAWaitUseTheClockAfterIt(t *testing.T) {
	c := harness.StartCoordinators(t, 1, batchClockRules)
	proxy := harness.NewProxy(t, c.GRPCAddrs()[0])
	a := startAgent(t, batchClockRules, func(cfg *agent.Config) {
		cfg.Coordinators = proxy.Addr()
		cfg.DecisionTimeout = 2 * time.Second
	})
	held := &rationv1.AllowRequest{Descriptors: map[string]string{"tenant": "held"}}
	if resp := a.allow(t, held); !resp.Allowed {
		t.Fatalf("first decision of tenant=held = %v, want admitted on its new lease", resp)
	}
	proxy.Stall()
	reqs := []*rationv1.AllowRequest{{Descriptors: map[string]string{"tenant": "new"}}}
	for i := 0; i < 5; i++ {
		reqs = append(reqs, held)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := a.rl.AllowBatch(ctx, &rationv1.AllowBatchRequest{Requests: reqs})
	if err != nil {
		t.Fatalf("AllowBatch: %v", err)
	}
	if r := resp.Responses[0]; r.Allowed || r.Reason != rationv1.Reason_REASON_UNAVAILABLE {
		t.Fatalf("new tenant with the coordinator unreachable = %v, want fail_closed after its cold start", r)
	}
	for i, r := range resp.Responses[1:] {
		if r.Allowed {
			t.Fatalf("item %d (tenant=held) admitted on a lease that expired while item 0 waited for its first grant: %v", i+1, r)
		}
	}
}
