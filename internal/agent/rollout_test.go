package agent_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
)

// rolloutRules are examples/rules.yaml's leased rules: an exact-key
// fail_closed rule and a default-share rule of many tenants.
const rolloutRules = `
rules:
  - name: hot-endpoint
    match: {endpoint: checkout}
    burst: 50
    rate: 20
    mode: leased
    lease: {period: 10s}
    on_failure: fail_closed
  - name: tenant-reports
    match: {tenant: "*", endpoint: reports}
    burst: 100
    rate: 100/m
    mode: leased
    lease: {period: 10s, default_share: 0.5}
    on_failure: fail_closed
  - name: per-key
    match: {key: "*"}
    burst: 10
    rate: 1
    mode: leased
    lease: {period: 10s}
    on_failure: fail_closed
`

// startLeasedAgent starts a storeless agent (every rule leased) against
// coords, with the production decision timeout, and does not wait for it
// to be ready.
func startLeasedAgent(t *testing.T, rulesYAML, coords, id string, mutate ...func(*agent.Config)) *agent.Server {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(rulesYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.RulesFile, cfg.Coordinators, cfg.AgentID, cfg.Insecure = path, coords, id, true
	cfg.HTTPAddr, cfg.GRPCAddr = "127.0.0.1:0", "127.0.0.1:0"
	for _, m := range mutate {
		m(&cfg)
	}
	srv, err := agent.Start(context.Background(), cfg, testLogger(t), nil)
	if err != nil {
		t.Fatalf("agent.Start: %v", err)
	}
	t.Cleanup(func() { stopAgent(srv) })
	return srv
}

func stopAgent(srv *agent.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
}

// readyz is the agent's /readyz status and body.
func readyz(t *testing.T, srv *agent.Server) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + srv.HTTPAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// An agent is not ready while the coordinators do not answer it, nor
// while the lease of an exact-key leased rule is not held: /readyz says
// which. Once the group is up, it is ready, and its first decision of
// each leased rule is made on a lease (admitted, or refused as over the
// limit when an earlier grant whose answer was lost while the node
// restarted still holds the pool: its rule's answer either way, never the
// failure policy's).
func TestReadyWaitsForCoordinatorsAndLeases(t *testing.T) {
	c := harness.StartCoordinators(t, 1, rolloutRules)
	c.Shutdown(0)
	srv := startLeasedAgent(t, rolloutRules, strings.Join(c.GRPCAddrs(), ","), "a1")
	// However long it waits, it stays unready: nothing answers it.
	for range 10 {
		time.Sleep(50 * time.Millisecond)
		if srv.Ready() {
			t.Fatal("agent ready while no coordinator answers")
		}
	}
	code, body := readyz(t, srv)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "coordinators") {
		t.Fatalf("/readyz with the coordinators down = %d %q, want 503 naming the coordinators", code, body)
	}
	c.Restart(0)
	waitFor(t, "agent ready once the coordinator is back", srv.Ready)
	if code, body := readyz(t, srv); code != http.StatusOK {
		t.Fatalf("/readyz once ready = %d %q", code, body)
	}
	for _, d := range []map[string]string{{"endpoint": "checkout"}, {"tenant": "t1", "endpoint": "reports"}} {
		resp, err := srv.Service.Decide(context.Background(), agent.Request{Descriptors: d})
		if err != nil || resp.Reason != agent.ReasonOK && resp.Reason != agent.ReasonOverLimit {
			t.Fatalf("first decision of %v = %+v, %v; want it decided on its lease", d, resp, err)
		}
	}
}

// The leased "*" case of a rollout: one agent, many fresh subjects in
// batches from 4 callers (100 each here; 1,000 in docs/leases.md's
// measurement). Each first grant is a coordinator
// round trip (a Raft commit of up to 1,000 quotas), longer than the 50ms
// decision timeout under load: it waits -first-grant-timeout, and on a
// healthy group no decision is made by the failure policy.
func TestLeasedWildcardFreshSubjectsInBatches(t *testing.T) {
	c := harness.StartCoordinators(t, 1, rolloutRules)
	// A link of 100 kB/s: a grant of 100 quotas (about 3.5 kB each way)
	// takes over 70ms, longer than the 50ms decision timeout however fast
	// the machine, and one of 1,000 well within the renewal's 2s limit.
	link := harness.NewProxy(t, c.GRPCAddrs()[0])
	link.SetRate(harness.Upstream, 100000)
	srv := startLeasedAgent(t, rolloutRules, link.Addr(), "a1", func(cfg *agent.Config) {
		// Generous under -race, where a grant of a thousand quotas can
		// take over a second; the decision timeout stays at 50ms.
		cfg.FirstGrantTimeout = 5 * time.Second
	})
	waitFor(t, "agent ready", srv.Ready)
	const callers, batch, maxBatches = 4, 100, 5
	var admitted, policy, total atomic.Int64
	var next atomic.Int64
	deadline := time.Now().Add(20 * time.Second)
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]agent.Request, batch)
			out := make([]agent.Response, batch)
			errs := make([]error, batch)
			for b := 0; b < maxBatches && time.Now().Before(deadline); b++ {
				for i := range reqs {
					reqs[i] = agent.Request{Rule: "per-key", Subject: fmt.Sprintf("k%d", next.Add(1))}
				}
				srv.Service.DecideBatch(context.Background(), reqs, out, errs)
				for i := range out {
					total.Add(1)
					switch {
					case errs[i] != nil:
						t.Errorf("request %d: %v", i, errs[i])
						return
					case out[i].Reason == agent.ReasonUnavailable || out[i].Reason == agent.ReasonEmergency:
						policy.Add(1)
					case out[i].Allowed:
						admitted.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	n := total.Load()
	t.Logf("%d fresh subjects: %d admitted (%.1f%%), %d by the failure policy", n, admitted.Load(), 100*float64(admitted.Load())/float64(max(n, 1)), policy.Load())
	if n == 0 {
		t.Fatal("no decision made")
	}
	if policy.Load() != 0 {
		t.Errorf("%d of %d first decisions fell to the failure policy on a healthy group", policy.Load(), n)
	}
	if float64(admitted.Load()) < 0.95*float64(n) {
		t.Errorf("admitted %d of %d fresh subjects, want >= 95%%", admitted.Load(), n)
	}
}

// A fresh agent on rediss:// to a Redis that holds no scripts (a new one,
// or any after a restart or failover) loads them before it is ready, so
// its first decision, with the production 50ms decision timeout, is made
// by Redis and not by the failure policy.
func TestFreshAgentOnRedisTLSFirstDecisionByRedis(t *testing.T) {
	pki := harness.NewPKI(t)
	r := harness.StartRedis(t, harness.WithTLS(pki.Issue("redis"), true))
	ctx := context.Background()
	if err := r.Client().ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	client := pki.Issue("agent")
	const yaml = `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 3
    rate: 0.001
    on_failure: fail_closed
`
	a := startAgentOn(t, "rediss://"+r.TLSAddr, yaml, func(cfg *agent.Config) {
		cfg.RedisTLS.CA, cfg.RedisTLS.Cert, cfg.RedisTLS.Key = client.CA, client.Cert, client.Key
		cfg.DecisionTimeout = agent.DefaultConfig().DecisionTimeout
	})
	exists, err := r.Client().ScriptExists(ctx, bucket.ScriptSHAs()...).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range exists {
		if !ok {
			t.Fatalf("script %s not loaded when the agent turned ready", bucket.ScriptSHAs()[i])
		}
	}
	resp, err := a.srv.Service.Decide(ctx, agent.Request{Descriptors: map[string]string{"user": "alice"}})
	if err != nil || !resp.Allowed || resp.Reason != agent.ReasonOK {
		t.Fatalf("first decision over rediss:// = %+v, %v; want admitted by Redis", resp, err)
	}
}

// A rolling restart of 3 agents under load on a healthy 3-node group:
// traffic goes only to ready agents (as a load balancer's readiness probe
// sends it), each agent in turn is stopped and a new process with its id
// started. No decision is made by a failure policy, and no tenant under
// its budget is refused: a restarted agent's copies of the default lease
// start from what the coordinators could give it, and a tenant its copy
// cannot pay for waits for its own lease instead of getting a 429.
func TestRollingRestartUnderLoad(t *testing.T) {
	c := harness.StartCoordinators(t, 3, rolloutRules)
	// Each agent reaches the group through a slow link (about 100ms for
	// a renewal's round trip, as the -dev pair measured): a first grant
	// takes longer than the 50ms decision timeout.
	var addrs []string
	for _, a := range c.GRPCAddrs() {
		px := harness.NewProxy(t, a)
		px.SetRate(harness.Upstream, 4000)
		addrs = append(addrs, px.Addr())
	}
	coords := strings.Join(addrs, ",")
	// A tenant its copy cannot pay for waits for a lease of its own, up to
	// -first-grant-timeout, and is refused by its copy if none comes: 1s
	// by default, which a grant through these slow links took now and
	// then under -race beside the heaviest packages (one wrong 429 in a
	// run). Generous here, as in TestLeasedWildcardFreshSubjectsInBatches:
	// what this test checks is that the tenant waits rather than being
	// refused at once, not how fast a loaded machine grants.
	patient := func(cfg *agent.Config) { cfg.FirstGrantTimeout = 5 * time.Second }
	const n = 3
	var slots [n]atomic.Pointer[agent.Server]
	// drain[i] is held (read) by each call to slot i's agent, and taken
	// (write) to swap it out: a stopping agent gets no call that started
	// before it was taken out, as its gRPC and HTTP servers drain theirs
	// before its leases are released. Decide is called in process here,
	// and a call racing the shutdown fell to the failure policy.
	var drain [n]sync.RWMutex
	for i := range n {
		srv := startLeasedAgent(t, rolloutRules, coords, fmt.Sprintf("agent-%d", i), patient)
		waitFor(t, "agent ready", srv.Ready)
		slots[i].Store(srv)
	}
	// 12 tenants, each at most maxPerTenant requests in all: under its
	// 100 of burst whatever agent decides them, but more than an agent's
	// copy of the default lease (a third of 50) pays for.
	const tenants, maxPerTenant, callers = 12, 80, 4
	var sent [tenants]atomic.Int64
	var stats struct {
		mu                                sync.Mutex
		decided, policy, wrong429, hot429 int
		first                             []string
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	deadline := time.Now().Add(60 * time.Second)
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(20 * time.Millisecond) // 4 callers: 200 requests/s
			defer tick.Stop()
			for k := 0; time.Now().Before(deadline); k++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				i := (w + k) % n
				drain[i].RLock()
				srv := slots[i].Load()
				if srv == nil || !srv.Ready() {
					drain[i].RUnlock()
					continue // a load balancer sends nothing to an unready agent
				}
				var d map[string]string
				tenant := -1
				if k%2 == 0 {
					d = map[string]string{"endpoint": "checkout"}
				} else {
					tenant = (w*7919 + k) % tenants
					if sent[tenant].Add(1) > maxPerTenant {
						drain[i].RUnlock()
						continue
					}
					d = map[string]string{"tenant": fmt.Sprint("t", tenant), "endpoint": "reports"}
				}
				resp, err := srv.Service.Decide(context.Background(), agent.Request{Descriptors: d})
				drain[i].RUnlock()
				stats.mu.Lock()
				stats.decided++
				switch {
				case err != nil:
					stats.first = append(stats.first, err.Error())
				case resp.Reason == agent.ReasonUnavailable || resp.Reason == agent.ReasonEmergency:
					stats.policy++
					stats.first = append(stats.first, fmt.Sprintf("%v: %+v", d, resp))
				case !resp.Allowed && tenant >= 0:
					stats.wrong429++
					stats.first = append(stats.first, fmt.Sprintf("%v: %+v", d, resp))
				case !resp.Allowed:
					stats.hot429++
				}
				stats.mu.Unlock()
			}
		}()
	}
	for i := range n {
		time.Sleep(500 * time.Millisecond) // load on the current agents first
		drain[i].Lock()
		old := slots[i].Load()
		slots[i].Store(nil)
		drain[i].Unlock()
		stopAgent(old)
		srv := startLeasedAgent(t, rolloutRules, coords, fmt.Sprintf("agent-%d", i), patient)
		slots[i].Store(srv)
		waitFor(t, "restarted agent ready", srv.Ready)
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	t.Logf("%d decisions: %d by a failure policy, %d refusals of tenants under budget, %d refusals of the hot endpoint (burst 50, 20/s: over its limit)",
		stats.decided, stats.policy, stats.wrong429, stats.hot429)
	if stats.decided < 100 {
		t.Fatalf("only %d decisions made", stats.decided)
	}
	// No failure-policy answer, ever. Refusals of tenants under budget: a
	// handful per run on a loaded machine (3 in 2,182 decisions beside
	// the other packages' tests), when a restarted agent's own grant for
	// a tenant comes back empty while the other agents still hold the
	// tenant's tokens and the coordinators have not moved them yet; quiet
	// runs see none. The test holds them under 1% of the tenants'
	// decisions, which a restart that refuses at once (the issue this
	// guards: 148-162 refusals per restart) exceeds many times over.
	tenantDecisions := (stats.decided - stats.hot429) / 2
	if stats.policy > 0 || stats.wrong429*100 > tenantDecisions {
		t.Fatalf("%d failure-policy answers, %d refusals of tenants under budget (of about %d tenant decisions; at most 1%%); first: %v",
			stats.policy, stats.wrong429, tenantDecisions, stats.first[:min(5, len(stats.first))])
	}
}

// A second agent that joins while the first spends the whole of a leased
// rule is granted an empty lease (the rule's tokens sit with the first
// agent until it renews) and turns ready after its first-grant wait with
// nothing to spend: its refusals are right, the budget is being spent,
// and each one over HTTP says when to retry, though its own bucket holds
// nothing that refills (the rule does).
func TestJoiningAgentsRefusalsSayWhenToRetry(t *testing.T) {
	c := harness.StartCoordinators(t, 1, rolloutRules)
	coords := strings.Join(c.GRPCAddrs(), ",")
	first := startLeasedAgent(t, rolloutRules, coords, "agent-a")
	waitFor(t, "first agent ready", first.Ready)
	hot := map[string]string{"endpoint": "checkout"}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Bounded: every millisecond for at most 30s.
		for range 30_000 {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			_, _ = first.Service.Decide(context.Background(), agent.Request{Descriptors: hot})
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	// The first agent's lease holds the rule's burst once it has spent
	// its first grant's worth.
	waitFor(t, "the first agent refusing", func() bool {
		resp, err := first.Service.Decide(context.Background(), agent.Request{Descriptors: hot})
		return err == nil && !resp.Allowed
	})
	second := startLeasedAgent(t, rolloutRules, coords, "agent-b")
	waitFor(t, "second agent ready", second.Ready)
	var refused int
	for i := range 20 {
		resp, err := http.Get("http://" + second.HTTPAddr() + "/v1/check?endpoint=checkout")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
		case http.StatusTooManyRequests:
			refused++
			ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if err != nil || ra < 1 {
				t.Errorf("request %d: 429 with Retry-After %q (RateLimit %q), want whole seconds >= 1", i, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit"))
			}
		default:
			t.Fatalf("request %d: %d, want 200 or 429 on a healthy group", i, resp.StatusCode)
		}
	}
	// 20 requests at once against a rule the first agent keeps spent: the
	// second agent's share is at most a few tokens.
	if refused == 0 {
		t.Fatal("20 requests to the second agent all admitted: the case (a refusal on a joining agent) never happened")
	}
}
