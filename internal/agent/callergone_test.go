package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Callers that hang up before the store answers (their own deadline far
// shorter than the agent's decision timeout, Redis stalled) are not store
// failures: however many there are, the circuit breaker stays closed and
// the next caller is decided on Redis again as soon as it answers.
func TestCallersHangingUpDoNotOpenTheBreaker(t *testing.T) {
	const rules = `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 100
    rate: 100
`
	a := startAgent(t, rules, func(c *agent.Config) {
		c.DecisionTimeout = 2 * time.Second
		c.Breaker.Threshold = 3
	})
	allow := func(timeout time.Duration) (*rationv1.AllowResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return a.rl.Allow(ctx, &rationv1.AllowRequest{Descriptors: map[string]string{"user": "u"}})
	}
	if r, err := allow(5 * time.Second); err != nil || !r.Allowed {
		t.Fatalf("first decision: %v %v, want admitted", r, err)
	}
	a.redis.Pause()
	t.Cleanup(a.redis.Resume) // before the agent's shutdown, should the test stop early
	for i := range 10 {
		// The caller gives up first; the agent may still answer just in
		// time ("unavailable": its copy of the deadline, taken from the
		// request, can pass a moment before the caller's own), never with
		// a decision from the stalled store.
		if r, err := allow(50 * time.Millisecond); err == nil && r.Reason != rationv1.Reason_REASON_UNAVAILABLE {
			t.Fatalf("call %d answered %v while Redis is stalled", i, r)
		}
	}
	// The agent notices the callers have gone once their contexts end;
	// give the store calls time to return.
	time.Sleep(200 * time.Millisecond)
	if open := metricValue(t, a.srv.Registry, "ration_breaker_open", nil); open != 0 {
		t.Fatalf("ration_breaker_open = %v after 10 callers hung up (threshold 3): callers leaving are not store failures", open)
	}
	for _, kind := range []string{"timeout", "canceled", "unavailable", "other"} {
		if n := metricValue(t, a.srv.Registry, "ration_store_errors_total", map[string]string{"kind": kind}); n != 0 {
			t.Errorf("ration_store_errors_total{kind=%q} = %v: a caller hanging up was counted as a store failure", kind, n)
		}
	}
	a.redis.Resume()
	r, err := allow(5 * time.Second)
	if err != nil || !r.Allowed {
		t.Fatalf("after Redis resumed: %v %v, want admitted", r, err)
	}
	if short := metricValue(t, a.srv.Registry, "ration_breaker_short_circuits_total", nil); short != 0 {
		t.Fatalf("ration_breaker_short_circuits_total = %v: a decision skipped the store", short)
	}
	if gone := metricValue(t, a.srv.Registry, "ration_store_errors_total", map[string]string{"kind": "caller_gone"}); gone < 1 {
		t.Errorf("ration_store_errors_total{kind=\"caller_gone\"} = %v, want the hung-up calls counted", gone)
	}
}
