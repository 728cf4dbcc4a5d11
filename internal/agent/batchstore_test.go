package agent_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

const batchBesideRules = `
rules:
  - name: batch
    match: {b: "*"}
    burst: 10
    rate: 0
    on_failure: fail_closed
  - name: single
    match: {s: "*"}
    burst: 1000000
    rate: 0
    on_failure: fail_closed
`

// An AllowBatch of the largest allowed size, over a link to Redis slow
// enough that sending the whole batch in one store call takes about three
// decision timeouts (a harness proxy that passes the agent's bytes at
// 400 kB/s, answers at full speed), while another client makes single
// decisions: the agent decides the batch in store calls of its own size,
// each within its timeout, so every item is decided by the store, no
// store call fails, the breaker never opens, and no single decision gets
// its rule's failure policy. Sent as one call, the batch timed out, its
// unanswered items counted one breaker failure each, and the open breaker
// answered the other client 503.
func TestMaxBatchDoesNotOpenBreaker(t *testing.T) {
	r := harness.StartRedis(t)
	slow := harness.NewProxy(t, r.Addr)
	slow.SetRate(harness.Upstream, 400e3)
	a := startAgentOn(t, slow.Addr(), batchBesideRules, func(cfg *agent.Config) {
		cfg.DecisionTimeout = 500 * time.Millisecond
	})
	a.redis = r

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var (
		wg      sync.WaitGroup
		done    = make(chan struct{})
		started = make(chan struct{})
		singles int
		bad     []string
	)
	single := func() {
		resp, err := a.rl.Allow(ctx, &rationv1.AllowRequest{Descriptors: map[string]string{"s": "other-client"}})
		switch {
		case err != nil:
			bad = append(bad, err.Error())
		case !resp.Allowed || resp.Reason != rationv1.Reason_REASON_OK:
			bad = append(bad, fmt.Sprintf("%v %v", resp.Allowed, resp.Reason))
		}
		singles++
	}
	wg.Go(func() {
		for i := 0; ; i++ {
			single()
			if i == 0 {
				close(started)
			}
			select {
			case <-done:
				return
			default:
			}
		}
	})
	<-started
	reqs := make([]*rationv1.AllowRequest, agent.MaxBatch)
	for i := range reqs {
		reqs[i] = &rationv1.AllowRequest{Descriptors: map[string]string{"b": fmt.Sprint("item-", i)}}
	}
	resp, err := a.rl.AllowBatch(ctx, &rationv1.AllowBatchRequest{Requests: reqs})
	close(done)
	wg.Wait()
	// And one just after it: the breaker the batch would have opened is
	// open for a probe interval.
	single()
	if err != nil {
		t.Fatalf("AllowBatch of %d: %v", len(reqs), err)
	}

	notStore := 0
	for i, r := range resp.Responses {
		if !r.Allowed || r.Reason != rationv1.Reason_REASON_OK {
			if notStore++; notStore <= 3 {
				t.Errorf("batch item %d = %v %v, want admitted by the store (reason ok)", i, r.Allowed, r.Reason)
			}
		}
	}
	if notStore > 0 {
		t.Errorf("%d of %d batch items not decided by the store", notStore, len(reqs))
	}
	if n := metricValue(t, a.srv.Registry, "ration_decisions_total",
		map[string]string{"rule": "batch", "path": "store", "result": "allowed", "reason": "ok"}); int(n) != agent.MaxBatch {
		t.Errorf("batch decisions counted on the store path = %v, want %d", n, agent.MaxBatch)
	}
	if len(bad) > 0 {
		t.Errorf("%d of %d single decisions beside the batch were not the store's ok: %q", len(bad), singles, bad[:min(len(bad), 3)])
	}
	for _, m := range []struct {
		name   string
		labels map[string]string
	}{
		{"ration_breaker_open", nil},
		{"ration_breaker_short_circuits_total", nil},
		{"ration_fallback_active", nil},
		{"ration_store_errors_total", map[string]string{"kind": "timeout"}},
		{"ration_store_errors_total", map[string]string{"kind": "unavailable"}},
		{"ration_fallback_activations_total", map[string]string{"rule": "single", "policy": "fail_closed"}},
		{"ration_fallback_activations_total", map[string]string{"rule": "batch", "policy": "fail_closed"}},
	} {
		if v := metricValue(t, a.srv.Registry, m.name, m.labels); v != 0 {
			t.Errorf("%s%v = %v, want 0", m.name, m.labels, v)
		}
	}
	t.Logf("%d single decisions beside the batch", singles)
}

// A store call of a batch that times out counts once against the circuit
// breaker, as a unary decision's call does: the batch's items fall to
// their policy (503 here), but the breaker, 3 failures from opening, stays
// closed, and the next single decision is the store's. Counted per item,
// one batch of 500 slow charges was 500 failures and opened the breaker
// for every caller. The link passes 20 kB/s: the batch's 500 charges need
// seconds, a single decision's some milliseconds.
func TestBatchStoreCallCountsOnceAgainstBreaker(t *testing.T) {
	r := harness.StartRedis(t)
	slow := harness.NewProxy(t, r.Addr)
	a := startAgentOn(t, slow.Addr(), batchBesideRules, func(cfg *agent.Config) {
		cfg.DecisionTimeout = 300 * time.Millisecond
	})
	a.redis = r
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// At full speed first: Redis learns the scripts (a script's first
	// call sends its text, kilobytes that the slow link would time out).
	a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"s": "warm"}})
	if _, err := a.rl.AllowBatch(ctx, &rationv1.AllowBatchRequest{Requests: []*rationv1.AllowRequest{
		{Descriptors: map[string]string{"b": "warm-1"}}, {Descriptors: map[string]string{"b": "warm-2"}},
	}}); err != nil {
		t.Fatal(err)
	}
	slow.SetRate(harness.Upstream, 20e3)

	reqs := make([]*rationv1.AllowRequest, 500)
	for i := range reqs {
		reqs[i] = &rationv1.AllowRequest{Descriptors: map[string]string{"b": fmt.Sprint("slow-item-", i)}}
	}
	resp, err := a.rl.AllowBatch(ctx, &rationv1.AllowBatchRequest{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Responses[len(reqs)-1]; r.Allowed || r.Reason != rationv1.Reason_REASON_UNAVAILABLE {
		t.Fatalf("last item of a batch the store could not answer in time = %v %v, want its fail_closed policy (unavailable)", r.Allowed, r.Reason)
	}
	if v := metricValue(t, a.srv.Registry, "ration_breaker_open", nil); v != 0 {
		t.Errorf("ration_breaker_open = %v after one failed store call, want 0 (threshold 3)", v)
	}
	single := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"s": "after"}})
	if !single.Allowed || single.Reason != rationv1.Reason_REASON_OK {
		t.Errorf("single decision after the batch = %v %v, want the store's ok", single.Allowed, single.Reason)
	}
	if v := metricValue(t, a.srv.Registry, "ration_breaker_short_circuits_total", nil); v != 0 {
		t.Errorf("ration_breaker_short_circuits_total = %v, want 0", v)
	}
}
