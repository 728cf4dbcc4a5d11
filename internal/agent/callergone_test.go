package agent_test

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/logformat"
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

// A thousand callers who hang up on a healthy store (a load tool closing
// its connections at the end of a run, clients with tight deadlines)
// activate nothing: no failure policy is counted or logged, no outage
// episode starts, and the emergency allowance keeps its one token. Each
// call is cut at another moment: before it is sent, while it is in
// flight, or as its answer comes back; over gRPC and over HTTP.
func TestThousandCallersGoneOnHealthyStore(t *testing.T) {
	const rules = `
rules:
  - name: closed
    match: {c: "*"}
    burst: 1000000
    rate: 1000000
    on_failure: fail_closed
  - name: open
    match: {o: "*"}
    burst: 1000000
    rate: 1000000
    on_failure: fail_open
  - name: emergency
    match: {e: "*"}
    burst: 1000000
    rate: 1000000
    on_failure: emergency
    emergency: {burst: 1, rate: 0.001, max_duration: 1m}
`
	r := harness.StartRedis(t)
	var logs harness.LogBuffer
	a := startAgentLogging(t, r.Addr, rules, nil, logformat.New(&logs, logformat.Text, slog.LevelInfo), func(c *agent.Config) {
		c.DecisionTimeout = 2 * time.Second
	})
	a.redis = r
	waitFor(t, "agent ready", a.srv.Ready)
	const calls = 1000
	keys := []string{"c", "o", "e"}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range calls {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			switch i % 4 {
			case 0: // gone before the call is sent
				cancel()
			default: // gone somewhere between 0 and ~1ms in
				time.AfterFunc(time.Duration(i%50)*20*time.Microsecond, cancel)
			}
			key := keys[i%len(keys)]
			if i%5 == 0 {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/v1/check?"+key+"=s"+strconv.Itoa(i%7), nil)
				if err != nil {
					t.Error(err)
					return
				}
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
				return
			}
			_, _ = a.rl.Allow(ctx, &rationv1.AllowRequest{Descriptors: map[string]string{key: "s" + strconv.Itoa(i%7)}})
		}()
	}
	wg.Wait()
	// Decisions still under way when their callers left end within the
	// decision timeout; wait for the store to have answered them all.
	time.Sleep(300 * time.Millisecond)
	for _, p := range []struct{ rule, policy string }{{"closed", "fail_closed"}, {"open", "fail_open"}, {"emergency", "emergency"}} {
		if n := metricValue(t, a.srv.Registry, "ration_fallback_activations_total", map[string]string{"rule": p.rule, "policy": p.policy}); n != 0 {
			t.Errorf("ration_fallback_activations_total{rule=%q} = %v after %d callers hung up on a healthy store", p.rule, n, calls)
		}
	}
	if active := metricValue(t, a.srv.Registry, "ration_fallback_active", nil); active != 0 {
		t.Errorf("ration_fallback_active = %v: callers hanging up started an outage episode", active)
	}
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "failure polic") || strings.Contains(l, "store unreachable") {
			t.Errorf("logged after callers hung up on a healthy store: %s", l)
		}
	}
	// The allowance is untouched: with the store stalled, a caller who
	// waits gets the emergency rule's one token.
	r.Pause()
	t.Cleanup(r.Resume)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := a.rl.Allow(ctx, &rationv1.AllowRequest{Descriptors: map[string]string{"e": "after"}})
	if err != nil || !resp.Allowed || resp.Reason != rationv1.Reason_REASON_EMERGENCY {
		t.Fatalf("first decision of a real outage on the emergency rule: %v %v, want admitted by the emergency allowance", resp, err)
	}
}
