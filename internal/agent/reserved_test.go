package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ration-dev/ration/examples"
	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// reservedRules is examples/rules.yaml (every mode: redis, shadow, leased,
// leased with default_share) and a mode auto rule.
func reservedRules() string {
	return string(examples.Rules()) + `
  - name: auto-key
    match: {key: "*"}
    burst: 100
    rate: 10
    mode: auto
    auto: {promote_above: 60, demote_below: 20, hold: 400ms}
    lease: {period: 2s}
`
}

// reservedNames are names a caller can send that look like the agent's
// own: the default quota's subject, the separators of quota ids, bucket
// keys, subjects and promoted subjects, hash tags, escapes, and an empty
// value.
var reservedNames = []string{
	"*", "**", "*@1", "x@1", "@", "|", "a|b", "tenant-reports|*", "{", "}", "{x}", "x}:auto",
	"%", "%2A", "=", ",", "tenant=*", "tenant=*,endpoint=reports", ":r:x", "ration:{tenant-reports|*}", "",
}

// No name a caller can send wedges a decision path: every reserved name,
// as a subject of every rule and as a descriptor value, through every
// entry point of a real agent (gRPC Allow, AllowBatch, AllowStream, Envoy's
// ShouldRateLimit, HTTP /v1/allow and /v1/check) against a real
// coordinator and Redis, each answered within a deadline (a lock taken
// twice hangs the call for good). Then every rule still decides, the
// lease loop still steps, and no goroutine is left behind.
func TestReservedNamesOnEveryPath(t *testing.T) {
	rulesYAML := reservedRules()
	c := harness.StartCoordinators(t, 1, rulesYAML)
	a := startAgent(t, rulesYAML, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
	})
	envoy := envoyClient(t, a)
	ruleNames := []string{"tenant-search", "per-user", "per-user-strict-shadow", "hot-endpoint", "export-global", "tenant-reports", "auto-key"}
	descKeys := []map[string]string{{"tenant": "", "endpoint": "reports"}, {"tenant": "", "endpoint": "search"}, {"user": ""}, {"key": ""}}
	before := runtime.NumGoroutine()

	// each runs one call with a deadline; a call still out then is a wedge.
	each := func(what string, call func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- call(ctx) }()
		select {
		case err := <-done:
			if err != nil && ctx.Err() != nil {
				t.Fatalf("%s: no answer before its deadline (wedged): %v", what, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the call did not return (wedged)", what)
		}
	}
	for _, name := range reservedNames {
		for _, rule := range ruleNames {
			req := &rationv1.AllowRequest{Rule: rule, Subject: name}
			what := fmt.Sprintf("rule %s subject %q", rule, name)
			each("Allow "+what, func(ctx context.Context) error {
				_, err := a.rl.Allow(ctx, req)
				return err
			})
			each("AllowBatch "+what, func(ctx context.Context) error {
				_, err := a.rl.AllowBatch(ctx, &rationv1.AllowBatchRequest{Requests: []*rationv1.AllowRequest{req, req}})
				return err
			})
			each("AllowStream "+what, func(ctx context.Context) error {
				st, err := a.rl.AllowStream(ctx)
				if err != nil {
					return err
				}
				if err := st.Send(req); err != nil {
					return err
				}
				_, err = st.Recv()
				_ = st.CloseSend()
				return err
			})
			each("POST /v1/allow "+what, func(ctx context.Context) error {
				body, _ := json.Marshal(map[string]any{"rule": rule, "subject": name})
				return httpCall(ctx, http.MethodPost, a.base+"/v1/allow", body)
			})
		}
		for _, keys := range descKeys {
			d := map[string]string{}
			for k, v := range keys {
				if v == "" {
					v = name
				}
				d[k] = v
			}
			what := fmt.Sprintf("descriptors %v", d)
			each("Allow "+what, func(ctx context.Context) error {
				_, err := a.rl.Allow(ctx, &rationv1.AllowRequest{Descriptors: d})
				return err
			})
			each("ShouldRateLimit "+what, func(ctx context.Context) error {
				var kv []string
				for k, v := range d {
					kv = append(kv, k, v)
				}
				_, err := envoy.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "ration", Descriptors: oneDescriptor(kv)})
				return err
			})
			each("GET /v1/check "+what, func(ctx context.Context) error {
				q := url.Values{}
				for k, v := range d {
					q.Set(k, v)
				}
				return httpCall(ctx, http.MethodGet, a.base+"/v1/check?"+q.Encode(), nil)
			})
		}
	}

	// The subject "*" is refused as a reserved name, on gRPC and HTTP.
	if _, err := a.rl.Allow(context.Background(), &rationv1.AllowRequest{Rule: "tenant-reports", Subject: "*"}); err == nil ||
		!strings.Contains(err.Error(), "reserved") {
		t.Fatalf(`Allow{tenant-reports, "*"} = %v, want INVALID_ARGUMENT naming the reserved subject`, err)
	}
	// Nothing a refused request named was charged: the reserved subject
	// has no bucket in Redis under any rule.
	for _, rule := range ruleNames {
		for _, key := range []string{"ration:{" + rule + "|*}", "ration:{" + rule + "|*}:auto"} {
			if n, err := a.redis.Client().Exists(context.Background(), key).Result(); err != nil || n != 0 {
				t.Fatalf("Redis key %s exists (%d, %v): a refused subject was charged", key, n, err)
			}
		}
	}
	// Every rule still decides a good request afterwards.
	for _, d := range []map[string]string{
		{"tenant": "acme", "endpoint": "reports"}, {"tenant": "acme", "endpoint": "search"}, {"user": "alice"},
		{"endpoint": "checkout"}, {"endpoint": "export"}, {"key": "k"},
	} {
		resp := a.allow(t, &rationv1.AllowRequest{Descriptors: d, Cost: 1})
		if !resp.Allowed {
			t.Fatalf("good request %v after the reserved names = %v, want admitted", d, resp)
		}
	}
	if cause := a.srv.Wedged(); cause != "" {
		t.Fatalf("agent reports itself wedged after the reserved names: %s", cause)
	}
	// Nothing left hanging: the goroutines come back to about where they
	// were (connections and streams close asynchronously).
	waitFor(t, "goroutines to settle", func() bool { return runtime.NumGoroutine() < before+50 })
}

func oneDescriptor(kv []string) []*ratelimitv3.RateLimitDescriptor {
	return []*ratelimitv3.RateLimitDescriptor{descriptor(kv...)}
}

func httpCall(ctx context.Context, method, u string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}
