package agent_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
)

const floodRule = `
rules:
  - name: flood
    match: {user: "*"}
    burst: 5
    rate: 0.5
`

// scriptCalls is how many script calls the Redis server has run.
func scriptCalls(t *testing.T, r *harness.Redis) int64 {
	t.Helper()
	info, err := r.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, l := range strings.Split(info, "\n") {
		if !strings.HasPrefix(l, "cmdstat_evalsha:") && !strings.HasPrefix(l, "cmdstat_eval:") {
			continue
		}
		_, rest, _ := strings.Cut(l, "calls=")
		v, _, _ := strings.Cut(rest, ",")
		c, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", l, err)
		}
		n += c
	}
	return n
}

// A subject flooding a mode: redis rule is denied by the agent itself
// while the store's last denial is certain: one client over its limit
// costs a script call per refill, not per request. The first request the
// refill can pay for goes to Redis and is admitted.
func TestFloodDeniedWithoutScriptCalls(t *testing.T) {
	r := harness.StartRedis(t)
	a := startAgentOn(t, r.Addr, floodRule)
	ctx := context.Background()
	req := agent.Request{Descriptors: map[string]string{"user": "flood"}}
	before := scriptCalls(t, r)
	var last agent.Response
	const n = 1000
	start := time.Now()
	admitted := 0
	for i := range n {
		resp, err := a.srv.Service.Decide(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Allowed {
			admitted++
			continue
		}
		if resp.Reason != agent.ReasonOverLimit || resp.RetryAfter <= 0 || resp.Remaining >= 1 || resp.Limit != 5 {
			t.Fatalf("denial %d = %+v; want over_limit with a Retry-After, under 1 token left, limit 5", i, resp)
		}
		last = resp
	}
	elapsed := time.Since(start)
	calls := scriptCalls(t, r) - before
	// The burst, and one denial from Redis; then one admission and one
	// denial for each token the refill (one each 2s) added meanwhile.
	refills := int64(elapsed/(2*time.Second)) + 1
	t.Logf("%d requests in %v: %d admitted, %d script calls", n, elapsed, admitted, calls)
	if max := 6 + 2*refills; calls > max {
		t.Errorf("%d script calls for %d requests of one subject over its limit, want at most %d", calls, n, max)
	}
	// The refill pays for one more after the last denial's Retry-After:
	// the agent asks Redis, which admits it.
	time.Sleep(last.RetryAfter + 50*time.Millisecond)
	if resp, err := a.srv.Service.Decide(ctx, req); err != nil || !resp.Allowed {
		t.Fatalf("request after the Retry-After of %v = %+v, %v; want admitted (the refill paid)", last.RetryAfter, resp, err)
	}
}

// 64 callers flood one subject at once: Redis admits the burst and the
// refill, the agent denies most of the rest itself.
func TestFloodFromManyCallers(t *testing.T) {
	r := harness.StartRedis(t)
	a := startAgentOn(t, r.Addr, floodRule)
	before := scriptCalls(t, r)
	var admitted, denied atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				resp, err := a.srv.Service.Decide(context.Background(), agent.Request{Descriptors: map[string]string{"user": "flood"}})
				switch {
				case err != nil:
					t.Error(err)
					return
				case resp.Allowed:
					admitted.Add(1)
				case resp.Reason == agent.ReasonOverLimit:
					denied.Add(1)
				default:
					t.Errorf("answer %+v; want admitted or over_limit", resp)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	calls := scriptCalls(t, r) - before
	t.Logf("3200 requests from 64 callers in %v: %d admitted, %d denied, %d script calls", elapsed, admitted.Load(), denied.Load(), calls)
	if bound := 5 + 0.5*elapsed.Seconds() + 1; float64(admitted.Load()) > bound {
		t.Errorf("admitted %d, over B + r T = %.1f", admitted.Load(), bound)
	}
	// Each lapse of the denial lets the callers in flight at that moment
	// through to Redis (at most 64), once per token refilled (every 2s).
	if max := 5 + 64*(int64(elapsed/(2*time.Second))+2); calls > max {
		t.Errorf("%d script calls for 3200 requests, want at most %d", calls, max)
	}
}

// A retry of an admitted request (same request id) is answered from
// Redis's record, admitted, even while the agent holds a denial of its
// bucket: requests with an id are never denied locally.
func TestRetryWithIDNotDeniedLocally(t *testing.T) {
	r := harness.StartRedis(t)
	a := startAgentOn(t, r.Addr, floodRule)
	ctx := context.Background()
	d := map[string]string{"user": "flood"}
	first := agent.Request{Descriptors: d, RequestID: "order-1"}
	if resp, err := a.srv.Service.Decide(ctx, first); err != nil || !resp.Allowed {
		t.Fatalf("first attempt = %+v, %v; want admitted", resp, err)
	}
	for i := range 10 { // the rest of the burst, then denials
		if _, err := a.srv.Service.Decide(ctx, agent.Request{Descriptors: d}); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if resp, err := a.srv.Service.Decide(ctx, first); err != nil || !resp.Allowed {
		t.Fatalf("retry of the admitted order-1 = %+v, %v; want admitted (Redis's record)", resp, err)
	}
}
