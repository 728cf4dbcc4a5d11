package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/breaker"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// testAgent is a gateway-agent started in-process against a real
// redis-server, reached over real gRPC and HTTP on loopback.
type testAgent struct {
	srv   *agent.Server
	redis *harness.Redis
	rl    rationv1.RateLimiterClient
	base  string // http://host:port
	rules string // rules file path
}

func startAgent(t *testing.T, rulesYAML string, mutate ...func(*agent.Config)) *testAgent {
	t.Helper()
	r := harness.StartRedis(t)
	a := startAgentOn(t, r.Addr, rulesYAML, mutate...)
	a.redis = r
	return a
}

// startAgentOn starts an agent against any Redis address form (single,
// redis-sentinel://, redis-cluster://).
func startAgentOn(t *testing.T, redisAddr, rulesYAML string, mutate ...func(*agent.Config)) *testAgent {
	t.Helper()
	return startAgentLeases(t, redisAddr, rulesYAML, nil, mutate...)
}

// startAgentLeases is startAgentOn with leases, when not nil, in place of
// the holder the agent would build (agent.Start's leases argument): a
// lease holder with a bug on purpose.
func startAgentLeases(t *testing.T, redisAddr, rulesYAML string, leases agent.Leases, mutate ...func(*agent.Config)) *testAgent {
	t.Helper()
	a := startAgentUnreadyOn(t, redisAddr, rulesYAML, leases, mutate...)
	waitFor(t, "agent ready", a.srv.Ready)
	return a
}

// startAgentUnready is startAgent without waiting for the agent to be
// ready: for agents that never can be (no coordinator that takes them).
func startAgentUnready(t *testing.T, rulesYAML string, mutate ...func(*agent.Config)) *testAgent {
	t.Helper()
	r := harness.StartRedis(t)
	a := startAgentUnreadyOn(t, r.Addr, rulesYAML, nil, mutate...)
	a.redis = r
	return a
}

func startAgentUnreadyOn(t *testing.T, redisAddr, rulesYAML string, leases agent.Leases, mutate ...func(*agent.Config)) *testAgent {
	t.Helper()
	return startAgentLogging(t, redisAddr, rulesYAML, leases, testLogger(t), mutate...)
}

// startAgentLogging is startAgentUnreadyOn with the agent's log going to
// logger: for tests that read what the agent logged.
func startAgentLogging(t *testing.T, redisAddr, rulesYAML string, leases agent.Leases, logger *slog.Logger, mutate ...func(*agent.Config)) *testAgent {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, []byte(rulesYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.RulesFile = path
	cfg.Redis = redisAddr
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.DecisionTimeout = 500 * time.Millisecond // generous: -race on 2 shared cores
	cfg.ReloadInterval = 50 * time.Millisecond
	for _, m := range mutate {
		m(&cfg)
	}
	// The coordinators of these tests are plaintext unless a test gives
	// the agent TLS files (tls_test.go).
	cfg.Insecure = !cfg.TLS.Enabled()
	srv, err := agent.Start(context.Background(), cfg, logger, leases)
	if err != nil {
		t.Fatalf("agent.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &testAgent{srv: srv, rl: rationv1.NewRateLimiterClient(conn), base: "http://" + srv.HTTPAddr(), rules: path}
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.DiscardHandler)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (a *testAgent) allow(t *testing.T, req *rationv1.AllowRequest) *rationv1.AllowResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := a.rl.Allow(ctx, req)
	if err != nil {
		t.Fatalf("Allow(%v): %v", req, err)
	}
	return resp
}

func (a *testAgent) dbsize(t *testing.T) int64 {
	t.Helper()
	n, err := a.redis.Client().DBSize(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

const oneRule = `
rules:
  - name: hot
    match: {user: "*"}
    burst: 100
    rate: 0
`

// 64 goroutines hammering one bucket of burst 100 and rate 0 through gRPC
// admit exactly 100: the script's read-decide-write is atomic.
func TestHammerOneBucketAdmitsExactlyBurst(t *testing.T) {
	a := startAgent(t, oneRule)
	var admitted, denied atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				resp, err := a.rl.Allow(context.Background(), &rationv1.AllowRequest{Descriptors: map[string]string{"user": "alice"}})
				if err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
				if resp.Allowed {
					admitted.Add(1)
				} else {
					denied.Add(1)
					if resp.Reason != rationv1.Reason_REASON_OVER_LIMIT || resp.RetryAfterMs != 0 {
						t.Errorf("denial = %v, want over_limit with no retry (rate 0)", resp)
					}
				}
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != 100 {
		t.Fatalf("admitted = %d of %d, want exactly 100", got, admitted.Load()+denied.Load())
	}
}

// Refill follows the server clock: over a run with rate > 0 the admitted
// count stays within burst + rate*elapsed, and the burst itself is admitted.
func TestRefillStaysWithinBound(t *testing.T) {
	a := startAgent(t, `
rules:
  - name: r
    match: {k: "*"}
    burst: 20
    rate: 50
`)
	const burst, rate = 20.0, 50.0
	start := time.Now()
	var admitted int
	for time.Since(start) < 1200*time.Millisecond {
		resp := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"k": "v"}})
		if resp.Allowed {
			admitted++
		}
	}
	elapsed := time.Since(start).Seconds()
	if bound := burst + rate*elapsed; float64(admitted) > bound+1e-9 {
		t.Fatalf("admitted %d in %.3fs, bound burst+rate*elapsed = %.1f", admitted, elapsed, bound)
	}
	if admitted < int(burst) {
		t.Fatalf("admitted %d, want at least the burst %v", admitted, burst)
	}
}

const twoRules = `
rules:
  - name: wide
    match: {tenant: "*"}
    burst: 10
    rate: 0
  - name: narrow
    match: {tenant: "*", endpoint: search}
    burst: 2
    rate: 0
  - name: shadowed
    match: {tenant: "*", endpoint: search}
    burst: 1
    rate: 0
    shadow: true
`

// A request is admitted only if every rule admits; the tokens the admitting
// rules took are given back when another rule denies.
func TestMultiRuleRefundAndShadow(t *testing.T) {
	a := startAgent(t, twoRules)
	search := map[string]string{"tenant": "acme", "endpoint": "search"}

	r1 := a.allow(t, &rationv1.AllowRequest{Descriptors: search})
	if !r1.Allowed || r1.Reason != rationv1.Reason_REASON_OK {
		t.Fatalf("1st = %v, want allowed ok", r1)
	}
	r2 := a.allow(t, &rationv1.AllowRequest{Descriptors: search})
	if !r2.Allowed || r2.Reason != rationv1.Reason_REASON_SHADOW {
		t.Fatalf("2nd = %v, want allowed with reason shadow (shadow rule burst 1 is spent)", r2)
	}
	r3 := a.allow(t, &rationv1.AllowRequest{Descriptors: search})
	if r3.Allowed || r3.Rule != "narrow" || r3.Reason != rationv1.Reason_REASON_OVER_LIMIT {
		t.Fatalf("3rd = %v, want denied by narrow", r3)
	}
	// wide was charged 3 times and refunded once: 8 left, so exactly 8 more
	// non-search calls pass. Without the refund it would be 7.
	var n int
	for i := 0; i < 10; i++ {
		if a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"tenant": "acme"}}).Allowed {
			n++
		}
	}
	if n != 8 {
		t.Fatalf("wide admitted %d more after the refund, want 8 (10 - 3 charged + 1 refunded)", n)
	}
	shadowDenied := metricValue(t, a.srv.Registry, "ration_decisions_total",
		map[string]string{"rule": "shadowed", "path": "store", "result": "denied", "reason": "over_limit"})
	if shadowDenied != 2 { // the 2nd and 3rd requests
		t.Fatalf("shadow rule denials counted = %v, want 2", shadowDenied)
	}
}

// metricValue reads one counter or gauge series from a registry.
func metricValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue next
				}
			}
			if m.Counter != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

func TestRequestIDChargesOnce(t *testing.T) {
	a := startAgent(t, oneRule)
	req := &rationv1.AllowRequest{Descriptors: map[string]string{"user": "bob"}, Cost: 60, RequestId: "req-1"}
	for i := 0; i < 3; i++ {
		if resp := a.allow(t, req); !resp.Allowed {
			t.Fatalf("attempt %d with the same id = %v, want the recorded admission", i, resp)
		}
	}
	// 40 left: a new id for 60 is denied, 40 is admitted.
	if resp := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"user": "bob"}, Cost: 60, RequestId: "req-2"}); resp.Allowed {
		t.Fatalf("a second id for 60 = %v, want denied: the repeated id must not have charged again", resp)
	}
	if resp := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"user": "bob"}, Cost: 40}); !resp.Allowed {
		t.Fatalf("40 more = %v, want allowed (100 - 60)", resp)
	}
}

// Bad input gets a clear error and touches no bucket.
func TestBadInputTouchesNothing(t *testing.T) {
	a := startAgent(t, oneRule)
	many := map[string]string{}
	for i := 0; i < 100; i++ {
		many[strings.Repeat("k", i+1)] = "v"
	}
	tests := []struct {
		name string
		req  *rationv1.AllowRequest
		want string
	}{
		{"unknown rule", &rationv1.AllowRequest{Rule: "nope", Subject: "x"}, "unknown rule"},
		{"empty descriptors", &rationv1.AllowRequest{}, "descriptor"},
		{"negative cost", &rationv1.AllowRequest{Descriptors: map[string]string{"user": "a"}, Cost: -1}, "cost"},
		{"cost above burst", &rationv1.AllowRequest{Descriptors: map[string]string{"user": "a"}, Cost: 101}, "cost exceeds burst"},
		{"too many descriptors", &rationv1.AllowRequest{Descriptors: many}, "descriptor"},
		{"both forms", &rationv1.AllowRequest{Descriptors: map[string]string{"user": "a"}, Rule: "hot", Subject: "a"}, "not both"},
		{"bad request id", &rationv1.AllowRequest{Descriptors: map[string]string{"user": "a"}, RequestId: "a b{"}, "request id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := a.rl.Allow(context.Background(), tt.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Allow = %v, want InvalidArgument mentioning %q", err, tt.want)
			}
		})
	}
	httpTests := []struct {
		name, method, path, body string
	}{
		{"malformed JSON", "POST", "/v1/allow", `{"descriptors":`},
		{"unknown field", "POST", "/v1/allow", `{"descriptors":{"user":"a"},"costs":1}`},
		{"zero cost", "POST", "/v1/allow", `{"descriptors":{"user":"a"},"cost":0}`},
		{"oversized body", "POST", "/v1/allow", `{"descriptors":{"user":"` + strings.Repeat("a", agent.MaxBodyBytes) + `"}}`},
		{"trailing data", "POST", "/v1/allow", `{"descriptors":{"user":"a"}} {}`},
		{"check bad cost", "GET", "/v1/check?user=a&cost=x", ""},
		{"check no descriptors", "GET", "/v1/check", ""},
		{"check repeated key", "GET", "/v1/check?user=a&user=b", ""},
	}
	for _, tt := range httpTests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, a.base+tt.path, strings.NewReader(tt.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || len(body) == 0 {
				t.Fatalf("%s %s = %d %q, want 400 with a message", tt.method, tt.path, resp.StatusCode, body)
			}
		})
	}
	if n := a.dbsize(t); n != 0 {
		t.Fatalf("Redis holds %d keys after only bad requests, want 0", n)
	}
	problems, err := testutil.GatherAndLint(a.srv.Registry)
	if err != nil || len(problems) > 0 {
		t.Fatalf("metrics lint: %v %+v", err, problems)
	}
}

func TestCheckEndpointStatusesAndHeaders(t *testing.T) {
	a := startAgent(t, `
rules:
  - name: tenant-search
    match: {tenant: "*", endpoint: search}
    burst: 3
    rate: 0.5
`)
	get := func() *http.Response {
		t.Helper()
		resp, err := http.Get(a.base + "/v1/check?tenant=acme&endpoint=search")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for i := 0; i < 3; i++ {
		resp := get()
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit-Policy") != `"tenant-search";q=3;w=6` || resp.Header.Get("RateLimit") == "" {
			t.Fatalf("check %d = %d %v, want 200 with RateLimit headers", i, resp.StatusCode, resp.Header)
		}
	}
	resp := get()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("4th check = %d, want 429", resp.StatusCode)
	}
	// One token at 0.5/s is at most 2s away, rounded up to whole seconds.
	if ra := resp.Header.Get("Retry-After"); ra != "2" && ra != "1" {
		t.Fatalf("Retry-After = %q, want 1 or 2 (seconds, rounded up)", ra)
	}
	if !strings.HasPrefix(resp.Header.Get("RateLimit"), `"tenant-search";r=0;`) {
		t.Fatalf("RateLimit = %q, want r=0", resp.Header.Get("RateLimit"))
	}
	// No rule matched: admitted, no quota headers.
	resp2, err := http.Get(a.base + "/v1/check?other=x")
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != 200 || resp2.Header.Get("X-Ration-Reason") != "no_rule" {
		t.Fatalf("unmatched check = %d reason %q, want 200 no_rule", resp2.StatusCode, resp2.Header.Get("X-Ration-Reason"))
	}
}

const policyRules = `
rules:
  - name: open
    match: {p: open}
    burst: 5
    rate: 0
    on_failure: fail_open
  - name: closed
    match: {p: closed}
    burst: 5
    rate: 0
    on_failure: fail_closed
  - name: emerg
    match: {p: emerg}
    burst: 5
    rate: 0
    on_failure: emergency
    emergency: {burst: 2, rate: 0, max_duration: 1s}
`

// countingStore counts calls that reach the real Redis store, so the test can
// prove an open breaker stops contacting it (without timing anything).
type countingStore struct {
	agent.Store
	takes atomic.Int64
}

func (c *countingStore) Take(ctx context.Context, r bucket.Request) (bucket.Result, error) {
	c.takes.Add(1)
	return c.Store.Take(ctx, r)
}

func (c *countingStore) TakeBatch(ctx context.Context, r []bucket.Request, out []bucket.Outcome) {
	c.takes.Add(1)
	c.Store.TakeBatch(ctx, r, out)
}

// With Redis stopped, each policy behaves as specified, and once the breaker
// is open decisions no longer contact Redis.
func TestRedisDownPolicies(t *testing.T) {
	r := harness.StartRedis(t)
	client, err := bucket.OpenRedis(r.Addr, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	store := &countingStore{Store: bucket.NewRedisStore(client, bucket.RedisOptions{Timeout: 200 * time.Millisecond})}
	set, err := rules.Parse("policies.yaml", []byte(policyRules))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	svc, err := agent.New(agent.Options{
		Rules: agent.StaticRules{Set: set}, Store: store, Logger: testLogger(t), Registry: reg,
		DecisionTimeout: 200 * time.Millisecond,
		Breaker:         breaker.Config{Threshold: 2, ProbeInterval: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	decide := func(p string) agent.Response {
		t.Helper()
		resp, err := svc.Decide(ctx, agent.Request{Descriptors: map[string]string{"p": p}})
		if err != nil {
			t.Fatalf("Decide(%s): %v", p, err)
		}
		return resp
	}
	if resp := decide("closed"); !resp.Allowed || resp.Reason != agent.ReasonOK {
		t.Fatalf("healthy decision = %+v, want ok", resp)
	}

	r.Stop()
	want := map[string]struct {
		allowed bool
		reason  agent.Reason
	}{
		"open":   {true, agent.ReasonUnavailable},
		"closed": {false, agent.ReasonUnavailable},
		"emerg":  {true, agent.ReasonEmergency},
	}
	for _, p := range []string{"open", "closed", "emerg"} {
		resp := decide(p)
		if w := want[p]; resp.Allowed != w.allowed || resp.Reason != w.reason {
			t.Fatalf("Redis down, rule %s = %+v, want allowed=%v reason=%v", p, resp, w.allowed, w.reason)
		}
	}
	if !svc.BreakerOpen() {
		t.Fatal("breaker still closed after 3 consecutive failures (threshold 2)")
	}
	before := store.takes.Load()
	// Emergency bucket: 2 tokens, one already used above.
	if resp := decide("emerg"); !resp.Allowed || resp.Reason != agent.ReasonEmergency {
		t.Fatalf("2nd emergency = %+v, want admitted from the local bucket", resp)
	}
	if resp := decide("emerg"); resp.Allowed || resp.Reason != agent.ReasonEmergency || agent.CheckStatus(resp) != 429 {
		t.Fatalf("3rd emergency = %+v, want denied by the local bucket (429)", resp)
	}
	if resp := decide("closed"); resp.Allowed || agent.CheckStatus(resp) != 503 {
		t.Fatalf("fail_closed with breaker open = %+v, want 503", resp)
	}
	if got := store.takes.Load() - before; got != 0 {
		t.Fatalf("%d store calls with the breaker open, want 0", got)
	}
	// Past max_duration, emergency fails closed.
	time.Sleep(1100 * time.Millisecond)
	if resp := decide("emerg"); resp.Allowed || resp.Reason != agent.ReasonUnavailable {
		t.Fatalf("emergency past max_duration = %+v, want fail closed (unavailable)", resp)
	}
	if got := metricValue(t, reg, "ration_fallback_activations_total", map[string]string{"rule": "emerg", "policy": "emergency"}); got != 1 {
		t.Fatalf("emergency activations = %v, want 1 per episode", got)
	}

	// Recovery is automatic: the prober closes the breaker.
	r.Restart()
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go svc.RunProber(pctx)
	waitFor(t, "breaker to close after Redis restarts", func() bool { return !svc.BreakerOpen() })
	if resp := decide("closed"); !resp.Allowed || resp.Reason != agent.ReasonOK {
		t.Fatalf("after recovery = %+v, want ok from Redis", resp)
	}
}

// The agent keeps its old rules when the file turns invalid, and picks up a
// valid change.
func TestReloadKeepsOldRulesOnBadFile(t *testing.T) {
	a := startAgent(t, oneRule)
	if err := os.WriteFile(a.rules, []byte("rules:\n  - name: hot\n    burst: -1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := a.srv.Reload()
	if err == nil || !strings.Contains(err.Error(), ":3:") {
		t.Fatalf("Reload(bad file) = %v, want an error naming line 3", err)
	}
	if resp := a.allow(t, &rationv1.AllowRequest{Rule: "hot", Subject: "x"}); !resp.Allowed || resp.Limit != 100 {
		t.Fatalf("after a bad reload = %v, want the old rule (limit 100) still serving", resp)
	}
	if err := os.WriteFile(a.rules, []byte(strings.ReplaceAll(oneRule, "burst: 100", "burst: 7")), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the watcher to pick up the change", func() bool {
		resp := a.allow(t, &rationv1.AllowRequest{Rule: "hot", Subject: "y"})
		return resp.Limit == 7
	})
}

// TestAllowBatchAnswersAsUnary: the server reads AllowBatch's requests with
// its own decoder, Allow's with protobuf's; every form of request gets the
// same answer either way (rule, reason, error), and a batch over MaxBatch
// is refused whole.
func TestAllowBatchAnswersAsUnary(t *testing.T) {
	a := startAgent(t, `
rules:
  - name: by-user
    match: {user: "*"}
    burst: 1000000000
    rate: 0 # remaining counts exactly what was taken
  - name: search
    match: {user: "*", endpoint: search}
    burst: 1000000000
    rate: 0 # remaining counts exactly what was taken
`)
	many := map[string]string{}
	for i := range rules.MaxDescriptors + 1 {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	reqs := []*rationv1.AllowRequest{
		{Descriptors: map[string]string{"user": "ann"}},
		{Descriptors: map[string]string{"user": "bob", "endpoint": "search"}, Cost: 3},
		{Descriptors: map[string]string{"user": "ann", "other": "x"}},
		{Descriptors: map[string]string{"endpoint": "search"}}, // no rule matches
		{Rule: "by-user", Subject: "carol", RequestId: "batch-1"},
		{Rule: "nope", Subject: "x"},
		{Descriptors: map[string]string{"user": "x"}, Rule: "by-user", Subject: "x"},
		{Descriptors: many},
		{Descriptors: map[string]string{"": "empty key"}},
		{Descriptors: map[string]string{"user": strings.Repeat("u", 300)}},
		{},
		{Descriptors: map[string]string{"user": "dan"}, Cost: -1},
	}
	ctx := context.Background()
	batch, err := a.rl.AllowBatch(ctx, &rationv1.AllowBatchRequest{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	if len(batch.Responses) != len(reqs) {
		t.Fatalf("%d answers to %d requests", len(batch.Responses), len(reqs))
	}
	for i, r := range reqs {
		got := batch.Responses[i]
		if r.RequestId != "" {
			r.RequestId += "-unary" // a fresh id: the batch's would replay
		}
		want, err := a.rl.Allow(ctx, r)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("request %d: unary Allow: %v", i, err)
			}
			if got.Reason != rationv1.Reason_REASON_INVALID || got.Error != status.Convert(err).Message() {
				t.Errorf("request %d: batch answered %v, unary refused it: %q", i, got, status.Convert(err).Message())
			}
			continue
		}
		if got.Allowed != want.Allowed || got.Reason != want.Reason || got.Rule != want.Rule || got.Limit != want.Limit || got.Error != "" {
			t.Errorf("request %d: batch answered %v, unary %v", i, got, want)
		}
	}

	over := make([]*rationv1.AllowRequest, agent.MaxBatch+1)
	for i := range over {
		over[i] = &rationv1.AllowRequest{Descriptors: map[string]string{"user": "eve"}}
	}
	full, err := a.rl.AllowBatch(ctx, &rationv1.AllowBatchRequest{Requests: over[:agent.MaxBatch]})
	if err != nil {
		t.Fatalf("batch of MaxBatch: %v", err)
	}
	if n, last := len(full.Responses), full.Responses[len(full.Responses)-1]; n != agent.MaxBatch || !last.Allowed || last.Rule != "by-user" ||
		last.Remaining != 1000000000-agent.MaxBatch {
		t.Fatalf("batch of MaxBatch: %d answers, the last %v", n, last)
	}
	if _, err := a.rl.AllowBatch(ctx, &rationv1.AllowBatchRequest{Requests: over}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), fmt.Sprintf("batch of %d requests", agent.MaxBatch+1)) {
		t.Fatalf("batch of MaxBatch+1: %v, want InvalidArgument naming its size", err)
	}
	if resp := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"user": "eve"}}); resp.Remaining != 1000000000-agent.MaxBatch-1 {
		t.Fatalf("eve's bucket after the refused batch: remaining %d, want MaxBatch+1 taken (the full batch and this call)", resp.Remaining)
	}
}

func TestAllowBatchAndStream(t *testing.T) {
	a := startAgent(t, oneRule)
	reqs := make([]*rationv1.AllowRequest, 0, 130)
	for i := 0; i < 120; i++ {
		reqs = append(reqs, &rationv1.AllowRequest{Descriptors: map[string]string{"user": "carol"}})
	}
	reqs = append(reqs, &rationv1.AllowRequest{Descriptors: map[string]string{"user": "dave"}, Cost: -3})
	resp, err := a.rl.AllowBatch(context.Background(), &rationv1.AllowBatchRequest{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	var admitted int
	for i, r := range resp.Responses[:120] {
		if r.Allowed {
			admitted++
			if i >= 100 {
				t.Errorf("item %d admitted; the first 100 should take the burst in order", i)
			}
		}
	}
	if admitted != 100 {
		t.Fatalf("batch admitted %d, want 100", admitted)
	}
	if last := resp.Responses[120]; last.Reason != rationv1.Reason_REASON_INVALID || last.Error == "" {
		t.Fatalf("invalid item = %v, want REASON_INVALID with a message", last)
	}

	stream, err := a.rl.AllowStream(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := stream.Send(&rationv1.AllowRequest{Descriptors: map[string]string{"user": "erin"}, Cost: 40}); err != nil {
			t.Fatal(err)
		}
	}
	// A bad request is answered in its turn, and the stream goes on.
	for _, r := range []*rationv1.AllowRequest{{Descriptors: map[string]string{"user": "erin"}, Cost: -1}, {Descriptors: map[string]string{"user": "erin"}, Cost: 20}} {
		if err := stream.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	_ = stream.CloseSend()
	var got []*rationv1.AllowResponse
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if len(got) != 5 || !got[0].Allowed || !got[1].Allowed || got[2].Allowed || !got[4].Allowed ||
		got[3].Reason != rationv1.Reason_REASON_INVALID || !strings.Contains(got[3].Error, "cost") || got[4].Remaining != 0 {
		t.Fatalf("stream answers = %v; want admitted, admitted, denied (40+40 of 100, then 40 > 20), "+
			"REASON_INVALID naming the cost, admitted with 0 left", got)
	}
}

// With Redis down, the check endpoint answers fail_open with 200 and no
// quota fields (no bucket was read), and fail_closed with 503 and
// Retry-After: 1.
func TestCheckEndpointRedisDown(t *testing.T) {
	a := startAgent(t, policyRules)
	a.redis.Stop()
	get := func(p string) *http.Response {
		t.Helper()
		resp, err := http.Get(a.base + "/v1/check?p=" + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	open := get("open")
	if open.StatusCode != 200 || open.Header.Get("RateLimit") != "" || open.Header.Get("X-Ration-Reason") != "unavailable" {
		t.Fatalf("fail_open with Redis down = %d %v, want 200, reason unavailable, no RateLimit", open.StatusCode, open.Header)
	}
	closed := get("closed")
	if closed.StatusCode != 503 || closed.Header.Get("Retry-After") != "1" || closed.Header.Get("RateLimit-Policy") != "" {
		t.Fatalf("fail_closed with Redis down = %d %v, want 503 with Retry-After 1 and no quota fields", closed.StatusCode, closed.Header)
	}
}

// A bad request to /v1/check is counted once in
// ration_requests_invalid_total, whether the query does not decode or the
// decision refuses it.
func TestCheckCountsABadRequestOnce(t *testing.T) {
	a := startAgent(t, oneRule)
	for _, q := range []string{"user=a&user=b", "user=a&cost=-1", "user=a&cost=101"} {
		before := metricValue(t, a.srv.Registry, "ration_requests_invalid_total", nil)
		resp, err := http.Get(a.base + "/v1/check?" + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		after := metricValue(t, a.srv.Registry, "ration_requests_invalid_total", nil)
		if resp.StatusCode != http.StatusBadRequest || after-before != 1 {
			t.Errorf("/v1/check?%s: status %d, invalid counter +%v; want 400 and +1", q, resp.StatusCode, after-before)
		}
	}
}
