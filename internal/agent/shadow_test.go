package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// shadowExtraRules are appended to examples/rules.yaml (which ends inside
// its rules list): a leased shadow rule over tenant-search's requests, whose
// quota id (rule|subject) gets too long for a coordinator to grant before
// tenant-search's subject gets too long for Redis.
const shadowExtraRules = `
  - name: tenant-search-leased-shadow
    match: {tenant: "*", endpoint: search}
    burst: 10
    rate: 1
    mode: leased
    lease: {period: 1s}
    shadow: true
`

// answer is what every entry point says of one request.
type shadowAnswer struct {
	allowed bool
	reason  string // lower case, as HTTP says it; "" where the API has none
	rule    string
}

// shadowEntry asks one request through one of the agent's APIs; an error
// is the API refusing the request.
type shadowEntry struct {
	name string
	ask  func(ctx context.Context, a *testAgent, desc map[string]string, cost int) (shadowAnswer, error)
}

func shadowEntries(t *testing.T, a *testAgent) []shadowEntry {
	envoy := envoyClient(t, a)
	fromProto := func(r *rationv1.AllowResponse) (shadowAnswer, error) {
		if r.Reason == rationv1.Reason_REASON_INVALID {
			return shadowAnswer{}, fmt.Errorf("REASON_INVALID: %s", r.Error)
		}
		return shadowAnswer{r.Allowed, strings.ToLower(strings.TrimPrefix(r.Reason.String(), "REASON_")), r.Rule}, nil
	}
	httpAnswer := func(resp *http.Response, err error) (shadowAnswer, error) {
		if err != nil {
			return shadowAnswer{}, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusBadRequest {
			return shadowAnswer{}, fmt.Errorf("400: %s", body)
		}
		if resp.Header.Get("Content-Type") == "application/json" {
			var out struct {
				Allowed bool   `json:"allowed"`
				Rule    string `json:"rule"`
				Reason  string `json:"reason"`
			}
			if err := json.Unmarshal(body, &out); err != nil {
				return shadowAnswer{}, fmt.Errorf("answer %q: %w", body, err)
			}
			return shadowAnswer{out.Allowed, out.Reason, out.Rule}, nil
		}
		return shadowAnswer{resp.StatusCode == http.StatusOK, resp.Header.Get("X-Ration-Reason"), ""}, nil
	}
	return []shadowEntry{
		{"grpc Allow", func(ctx context.Context, a *testAgent, desc map[string]string, cost int) (shadowAnswer, error) {
			r, err := a.rl.Allow(ctx, &rationv1.AllowRequest{Descriptors: desc, Cost: float64(cost)})
			if err != nil {
				return shadowAnswer{}, err
			}
			return fromProto(r)
		}},
		{"grpc AllowBatch", func(ctx context.Context, a *testAgent, desc map[string]string, cost int) (shadowAnswer, error) {
			r, err := a.rl.AllowBatch(ctx, &rationv1.AllowBatchRequest{Requests: []*rationv1.AllowRequest{
				{Descriptors: desc, Cost: float64(cost)},
				{Descriptors: map[string]string{"endpoint": "none"}}, // a second item: a batch, not a lone request
			}})
			if err != nil {
				return shadowAnswer{}, err
			}
			return fromProto(r.Responses[0])
		}},
		{"grpc AllowStream", func(ctx context.Context, a *testAgent, desc map[string]string, cost int) (shadowAnswer, error) {
			s, err := a.rl.AllowStream(ctx)
			if err != nil {
				return shadowAnswer{}, err
			}
			if err := s.Send(&rationv1.AllowRequest{Descriptors: desc, Cost: float64(cost)}); err != nil {
				return shadowAnswer{}, err
			}
			r, err := s.Recv()
			_ = s.CloseSend()
			if err != nil {
				return shadowAnswer{}, err
			}
			return fromProto(r)
		}},
		{"envoy ShouldRateLimit", func(ctx context.Context, a *testAgent, desc map[string]string, cost int) (shadowAnswer, error) {
			d := &ratelimitv3.RateLimitDescriptor{HitsAddend: wrapperspb.UInt64(uint64(cost))}
			for k, v := range desc {
				d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
			}
			r, err := envoy.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
			if err != nil {
				return shadowAnswer{}, err
			}
			return shadowAnswer{allowed: r.OverallCode == rlsv3.RateLimitResponse_OK}, nil
		}},
		{"http /v1/check", func(ctx context.Context, a *testAgent, desc map[string]string, cost int) (shadowAnswer, error) {
			q := url.Values{"cost": {fmt.Sprint(cost)}}
			for k, v := range desc {
				q.Set(k, v)
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/v1/check?"+q.Encode(), nil)
			if err != nil {
				return shadowAnswer{}, err
			}
			return httpAnswer(http.DefaultClient.Do(req))
		}},
		{"http /v1/allow", func(ctx context.Context, a *testAgent, desc map[string]string, cost int) (shadowAnswer, error) {
			body, err := json.Marshal(map[string]any{"descriptors": desc, "cost": cost})
			if err != nil {
				return shadowAnswer{}, err
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+"/v1/allow", bytes.NewReader(body))
			if err != nil {
				return shadowAnswer{}, err
			}
			return httpAnswer(http.DefaultClient.Do(req))
		}},
	}
}

// A shadow rule's verdicts are reported, never enforced, including on a
// request it could never admit. With examples/rules.yaml, a request of
// user=* costing more than the shadow rule's burst (5), which per-user
// (burst 100) admits, is admitted with reason shadow on every API; so is a
// request whose leased shadow rule's quota id is too long for a
// coordinator, which tenant-search admits. The shadow rule's denial is
// counted (path none), nothing is charged in its name, and a cost over the
// burst of a rule in force is still refused.
func TestShadowRuleNeverRefuses(t *testing.T) {
	example, err := os.ReadFile("../../examples/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rulesYAML := string(example) + shadowExtraRules
	c := harness.StartCoordinators(t, 1, rulesYAML)
	logPath := filepath.Join(t.TempDir(), "admissions.log")
	a := startAgent(t, rulesYAML, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
		cfg.Record = logPath
	})
	longTenant := strings.Repeat("t", 250) // tenant-search-leased-shadow|endpoint=search,tenant=ttt... is over 256 bytes

	tests := []struct {
		name       string
		desc       map[string]string
		cost       int
		want       shadowAnswer // reason and rule where the API carries them
		shadowRule string       // whose denial is counted, with path none
	}{
		{"cost over the shadow rule's burst", map[string]string{"user": "u"}, 6,
			shadowAnswer{true, "shadow", "per-user"}, "per-user-strict-shadow"},
		{"leased shadow rule's quota id too long", map[string]string{"tenant": longTenant, "endpoint": "search"}, 1,
			shadowAnswer{true, "shadow", "tenant-search"}, "tenant-search-leased-shadow"},
	}
	entries := shadowEntries(t, a)
	for _, tt := range tests {
		for i, e := range entries {
			t.Run(tt.name+"/"+e.name, func(t *testing.T) {
				desc := map[string]string{}
				for k, v := range tt.desc {
					if k == "user" || k == "tenant" {
						v += fmt.Sprint(i) // a fresh subject on each API
					}
					desc[k] = v
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				got, err := e.ask(ctx, a, desc, tt.cost)
				if err != nil {
					t.Fatalf("refused: %v; want %+v (the shadow rule's verdict is never enforced)", err, tt.want)
				}
				want := tt.want
				if got.reason == "" {
					want.reason = ""
				}
				if got.rule == "" {
					want.rule = ""
				}
				if got != want {
					t.Fatalf("answer %+v, want %+v", got, want)
				}
			})
		}
		denied := metricValue(t, a.srv.Registry, "ration_decisions_total",
			map[string]string{"rule": tt.shadowRule, "path": "none", "result": "denied", "reason": "over_limit"})
		if int(denied) != len(entries) {
			t.Errorf("%s: %s's denials counted with path none = %v, want %d (one per API)", tt.name, tt.shadowRule, denied, len(entries))
		}
	}
	keys, err := a.redis.Client().Keys(context.Background(), "*shadow*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Errorf("keys charged in a shadow rule's name: %q; a request it could never admit charges nothing", keys)
	}

	// The admission log records each shadow denial as charging nothing:
	// the overshoot checker finds no quota over its burst.
	shadowRecs := 0
	for _, r := range readLog(t, logPath) {
		if strings.Contains(r.Quota, "shadow|") {
			shadowRecs++
			if r.Allowed {
				t.Errorf("admission log: %+v recorded as admitted; a shadow rule's denial charged nothing", r)
			}
		}
	}
	if shadowRecs != 2*len(entries) {
		t.Errorf("admission log: %d records of the shadow rules, want %d", shadowRecs, 2*len(entries))
	}
	for _, rep := range admission.CheckAll(readLog(t, logPath)) {
		if rep.Overshoot > 0 {
			t.Errorf("admission log: quota %s over its burst %v by %v", rep.Quota, rep.Burst, rep.Overshoot)
		}
	}

	// The rules in force still refuse what they could never admit.
	for _, e := range entries {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		got, err := e.ask(ctx, a, map[string]string{"user": "over"}, 101)
		cancel()
		if err == nil {
			t.Errorf("%s: cost 101 over per-user's burst 100 = %+v, want refused as invalid", e.name, got)
		}
	}
}

const shadowPolicyRules = `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 100
    rate: 10
    on_failure: emergency
    emergency: {burst: 10, rate: 5, max_duration: 30s}
  - name: strict-shadow-open
    match: {user: "*"}
    burst: 5
    rate: 1
    shadow: true
    on_failure: fail_open
  - name: strict-shadow-closed
    match: {user: "*"}
    burst: 5
    rate: 1
    shadow: true
    on_failure: fail_closed
`

// With the store down, shadow rules fall to their failure policies, and
// those verdicts are reported, never enforced either: a shadow rule that
// fails closed does not refuse (nor 503) a request the rule in force
// admits from its emergency allowance, and a shadow rule that fails open
// does not make that answer read as one made without any bucket (reason
// unavailable, and no quota fields on the check endpoint): it is the
// emergency bucket's. The shadow rules' fallback decisions are counted.
func TestShadowRuleStoreDownNeverRefuses(t *testing.T) {
	a := startAgent(t, shadowPolicyRules)
	a.redis.Stop()
	for i, e := range shadowEntries(t, a) {
		t.Run(e.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			got, err := e.ask(ctx, a, map[string]string{"user": fmt.Sprint("down", i)}, 1)
			if err != nil {
				t.Fatalf("refused: %v; want admitted by per-user's emergency allowance", err)
			}
			want := shadowAnswer{true, "emergency", "per-user"}
			if got.reason == "" {
				want.reason = ""
			}
			if got.rule == "" {
				want.rule = ""
			}
			if got != want {
				t.Fatalf("answer %+v, want %+v", got, want)
			}
		})
	}
	for _, rule := range []string{"strict-shadow-open", "strict-shadow-closed"} {
		var n float64
		for _, result := range []string{"allowed", "denied"} {
			n += metricValue(t, a.srv.Registry, "ration_decisions_total",
				map[string]string{"rule": rule, "path": "fallback", "result": result, "reason": "unavailable"})
		}
		if n == 0 {
			t.Errorf("%s: no fallback decision counted; its failure policy's verdicts are reported", rule)
		}
	}
}
