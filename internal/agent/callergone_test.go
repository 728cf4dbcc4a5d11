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

// A caller who hangs up before its decision's dependency answers gets no
// failure policy: the decision is counted as caller_gone and touches no
// policy, outage episode or emergency allowance. Rules of every policy are
// called while Redis is stalled, each by callers who give up first; none
// may count an activation, start an episode, or spend the emergency
// allowance (its one token is there for the first decision after).
func TestCallerGoneActivatesNoPolicy(t *testing.T) {
	const rules = `
rules:
  - name: closed
    match: {c: "*"}
    burst: 100
    rate: 100
    on_failure: fail_closed
  - name: open
    match: {o: "*"}
    burst: 100
    rate: 100
    on_failure: fail_open
  - name: emergency
    match: {e: "*"}
    burst: 100
    rate: 100
    on_failure: emergency
    emergency: {burst: 1, rate: 0.001, max_duration: 1m}
`
	a := startAgent(t, rules, func(c *agent.Config) {
		c.DecisionTimeout = 2 * time.Second
		c.Breaker.Threshold = 1000
	})
	allow := func(timeout time.Duration, key string) (*rationv1.AllowResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return a.rl.Allow(ctx, &rationv1.AllowRequest{Descriptors: map[string]string{key: "s"}})
	}
	for _, key := range []string{"c", "o", "e"} {
		if r, err := allow(5*time.Second, key); err != nil || !r.Allowed {
			t.Fatalf("first decision of %s: %v %v, want admitted", key, r, err)
		}
	}
	a.redis.Pause()
	t.Cleanup(a.redis.Resume)
	for i := range 5 {
		for _, key := range []string{"c", "o", "e"} {
			if r, err := allow(50*time.Millisecond, key); err == nil && r.Allowed {
				t.Fatalf("call %d of %s admitted while Redis is stalled and its caller gone: %v", i, key, r)
			}
		}
	}
	time.Sleep(200 * time.Millisecond) // the store calls return once their callers' contexts end
	for _, p := range []struct{ rule, policy string }{{"closed", "fail_closed"}, {"open", "fail_open"}, {"emergency", "emergency"}} {
		if n := metricValue(t, a.srv.Registry, "ration_fallback_activations_total", map[string]string{"rule": p.rule, "policy": p.policy}); n != 0 {
			t.Errorf("ration_fallback_activations_total{rule=%q} = %v: a caller hanging up activated its failure policy", p.rule, n)
		}
	}
	if active := metricValue(t, a.srv.Registry, "ration_fallback_active", nil); active != 0 {
		t.Errorf("ration_fallback_active = %v: callers hanging up started an outage episode", active)
	}
	if gone := metricValue(t, a.srv.Registry, "ration_store_errors_total", map[string]string{"kind": "caller_gone"}); gone < 15 {
		t.Errorf("ration_store_errors_total{kind=\"caller_gone\"} = %v, want the 15 hung-up calls counted", gone)
	}
	// A real outage now (callers who wait): the emergency rule's one token
	// is still there for its first fallback decision.
	if r, err := allow(5*time.Second, "e"); err != nil || !r.Allowed || r.Reason != rationv1.Reason_REASON_EMERGENCY {
		t.Fatalf("first decision of a real outage on the emergency rule: %v %v, want admitted by the emergency allowance", r, err)
	}
}
