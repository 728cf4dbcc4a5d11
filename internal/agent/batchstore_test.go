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
	slow := harness.StartThrottle(t, r.Addr, 400e3)
	a := startAgentOn(t, slow.Addr, batchBesideRules, func(cfg *agent.Config) {
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
