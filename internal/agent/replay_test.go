package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Rules for the request-id tests: every budget is small and refills
// (next to) nothing, so what each id charged shows in which later request
// is denied. The leased rules refill at 0.001/s, not 0: a quota of rate 0
// gets no slice on its first grant.
const idRules = `
rules:
  - name: id-leased
    match: {id: leased}
    burst: 3
    rate: 0.001
    mode: leased
    lease: {period: 1s}
  - name: id-emergency
    match: {id: emergency}
    burst: 100
    rate: 0
    on_failure: emergency
    emergency: {burst: 3, rate: 0, max_duration: 1m}
  - name: id-open
    match: {id: open}
    burst: 100
    rate: 0
    on_failure: fail_open
  - name: id-store
    match: {tenant: "*"}
    burst: 5
    rate: 0
  - name: id-mixed
    match: {tenant: "*", hot: "yes"}
    burst: 3
    rate: 0.001
    mode: leased
    lease: {period: 1s}
`

// readLog reads an agent's -record file.
func readLog(t *testing.T, path string) []admission.Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := admission.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// stopRedis stops the agent's Redis for the rest of the test. It is
// started again just before the agent shuts down: the Redis client's Close
// otherwise waits out its dial retries, seconds per test.
func stopRedis(t *testing.T, a *testAgent) {
	t.Helper()
	a.redis.Stop()
	t.Cleanup(a.redis.Restart)
}

// chargesByID counts, per quota and request id, the admitted decisions
// that charged (replays excluded), and the replays.
func chargesByID(recs []admission.Record) (charged map[string]int, replays int) {
	charged = map[string]int{}
	for _, r := range recs {
		switch {
		case r.Path == "replay":
			replays++
		case r.Allowed && r.RequestID != "":
			charged[r.Quota+" "+r.RequestID]++
		}
	}
	return charged, replays
}

// A request_id holds on every path, not only Redis's: a retry through the
// same agent with the same id returns the recorded decision and charges
// nothing; different ids charge each. Leased against a real coordinator
// group; emergency and fail_open with Redis stopped.
func TestRequestIDEveryPath(t *testing.T) {
	coords := harness.StartCoordinators(t, 1, idRules)
	tests := []struct {
		name      string
		desc      map[string]string
		stopRedis bool
		// calls are the ids sent in order; want their verdicts.
		calls []string
		want  []bool
		// reason every answer (replays included) must carry.
		reason rationv1.Reason
		rule   string // the quota's rule, for the metrics
		path   string // the path the charged decisions take
	}{
		{"leased", map[string]string{"id": "leased"}, false,
			[]string{"a", "a", "a", "b", "c", "b", "d"}, []bool{true, true, true, true, true, true, false},
			0, "id-leased", "leased"},
		{"emergency", map[string]string{"id": "emergency"}, true,
			[]string{"a", "a", "b", "a", "c", "d", "c"}, []bool{true, true, true, true, true, false, true},
			rationv1.Reason_REASON_EMERGENCY, "id-emergency", "fallback"},
		{"fail_open", map[string]string{"id": "open"}, true,
			[]string{"a", "a", "b", "b", "a", "c"}, []bool{true, true, true, true, true, true},
			rationv1.Reason_REASON_UNAVAILABLE, "id-open", "fallback"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logPath := filepath.Join(t.TempDir(), "adm.log")
			a := startAgent(t, idRules, func(cfg *agent.Config) {
				cfg.Coordinators = strings.Join(coords.GRPCAddrs(), ",")
				cfg.Record = logPath
				cfg.AgentID = "id-" + tt.name
			})
			if tt.stopRedis {
				stopRedis(t, a)
			}
			first := map[string]*rationv1.AllowResponse{}
			for i, id := range tt.calls {
				resp := a.allow(t, &rationv1.AllowRequest{Descriptors: tt.desc, RequestId: id})
				if resp.Allowed != tt.want[i] {
					t.Fatalf("call %d (id %s) = %v, want allowed=%v", i, id, resp, tt.want[i])
				}
				if tt.reason != 0 && resp.Reason != tt.reason {
					t.Fatalf("call %d (id %s) reason = %v, want %v", i, id, resp.Reason, tt.reason)
				}
				if f, ok := first[id]; ok {
					// The recorded decision, field for field.
					if f.Allowed != resp.Allowed || f.Remaining != resp.Remaining || f.Reason != resp.Reason || f.Rule != resp.Rule {
						t.Fatalf("retry of %s = %v, want the recorded %v", id, resp, f)
					}
				} else {
					first[id] = resp
				}
			}
			distinct := len(first)
			retries := len(tt.calls) - distinct
			admittedIDs := 0
			for _, r := range first {
				if r.Allowed {
					admittedIDs++
				}
			}
			// Metrics: each id decided once on its path, every retry replayed.
			if got := metricValue(t, a.srv.Registry, "ration_request_id_replays_total", map[string]string{"rule": tt.rule}); got != float64(retries) {
				t.Errorf("replays counted = %v, want %d", got, retries)
			}
			var decided float64
			for _, reason := range []string{"ok", "over_limit", "unavailable", "emergency"} {
				for _, result := range []string{"allowed", "denied"} {
					decided += metricValue(t, a.srv.Registry, "ration_decisions_total",
						map[string]string{"rule": tt.rule, "path": tt.path, "result": result, "reason": reason})
				}
			}
			if decided != float64(distinct) {
				t.Errorf("decisions on path %s = %v, want one per distinct id (%d)", tt.path, decided, distinct)
			}
			// The admission log: each id charged at most once, retries
			// logged as replays.
			charged, replays := chargesByID(readLog(t, logPath))
			total := 0
			for k, n := range charged {
				total += n
				if n > 1 {
					t.Errorf("%s charged %d times, want once", k, n)
				}
			}
			if total != admittedIDs || replays != retries {
				t.Errorf("log: %d charged admissions, %d replays; want %d and %d", total, replays, admittedIDs, retries)
			}
		})
	}
}

// A request matching a Redis rule and a leased rule: its retry replays
// both verdicts at once and charges neither bucket; when the leased rule
// denies, the Redis charge is refunded once and the retry is denied again.
func TestRequestIDRedisAndLeased(t *testing.T) {
	coords := harness.StartCoordinators(t, 1, idRules)
	a := startAgent(t, idRules, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(coords.GRPCAddrs(), ",")
	})
	both := map[string]string{"tenant": "acme", "hot": "yes"}
	for i, c := range []struct {
		id   string
		want bool
	}{{"m1", true}, {"m1", true}, {"m2", true}, {"m1", true}, {"m3", true}, {"m4", false}, {"m4", false}, {"m2", true}} {
		resp := a.allow(t, &rationv1.AllowRequest{Descriptors: both, RequestId: c.id})
		if resp.Allowed != c.want {
			t.Fatalf("call %d (id %s) = %v, want allowed=%v", i, c.id, resp, c.want)
		}
	}
	// id-store (burst 5) was charged by m1, m2, m3 only (m4's charge was
	// refunded when id-mixed denied it): 2 left.
	for i, want := range []bool{true, true, false} {
		resp := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"tenant": "acme"}})
		if resp.Allowed != want {
			t.Fatalf("Redis-only call %d = %v, want allowed=%v (5 - 3 charged ids)", i, resp, want)
		}
	}
}

// Concurrent duplicates (one id sent by many callers at once, and twice in
// one batch) charge once.
func TestRequestIDConcurrentDuplicates(t *testing.T) {
	a := startAgent(t, `
rules:
  - name: id-emergency
    match: {id: emergency}
    burst: 100
    rate: 0
    on_failure: emergency
    emergency: {burst: 3, rate: 0, max_duration: 1m}
`)
	stopRedis(t, a)
	desc := map[string]string{"id": "emergency"}
	var wg sync.WaitGroup
	answers := make([]*rationv1.AllowResponse, 16)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := a.rl.Allow(context.Background(), &rationv1.AllowRequest{Descriptors: desc, RequestId: "same"})
			if err != nil {
				t.Errorf("Allow: %v", err)
				return
			}
			answers[i] = resp
		}()
	}
	wg.Wait()
	for i, r := range answers {
		if r != nil && !r.Allowed {
			t.Fatalf("concurrent duplicate %d = %v, want the one admission", i, r)
		}
	}
	batch, err := a.rl.AllowBatch(context.Background(), &rationv1.AllowBatchRequest{Requests: []*rationv1.AllowRequest{
		{Descriptors: desc, RequestId: "pair"}, {Descriptors: desc, RequestId: "pair"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range batch.Responses {
		if !r.Allowed {
			t.Fatalf("batch item %d = %v, want admitted (2 of 3 spent)", i, r)
		}
	}
	// "same" and "pair" took 2 of the emergency burst of 3.
	for i, want := range []bool{true, false} {
		resp := a.allow(t, &rationv1.AllowRequest{Descriptors: desc, RequestId: fmt.Sprintf("after-%d", i)})
		if resp.Allowed != want {
			t.Fatalf("fresh id %d = %v, want allowed=%v: duplicates must have charged once", i, resp, want)
		}
	}
}
