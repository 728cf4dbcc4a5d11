package bound

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/coordclient"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// testAgent is one agent in-process, reached as its callers reach it: over
// gRPC (Ration's API and Envoy's) and HTTP on loopback. Its link to each
// coordinator goes through a harness.Proxy of its own.
type testAgent struct {
	name     string
	region   string
	rules    []string              // the rules its callers use
	srv      *agent.Server         // in-process; nil for the process
	proc     *harness.AgentProcess // the agent run as a process (process_test.go); nil in-process
	proxies  []*harness.Proxy
	rl       rationv1.RateLimiterClient
	envoy    rlsv3.RateLimitServiceClient
	base     string
	http     *http.Client
	stalled  bool         // its links are under a fault, or it is paused: the schedule's; the test's goroutine only
	quiet    atomic.Bool  // callers leave it alone meanwhile
	inflight atomic.Int64 // calls sent to it and not yet answered
}

// startAgent starts one more agent of region on the shared rules file,
// leasing from that region's group. An agent of the main region joins the
// agents the schedule and the workers pick from, with every rule; the
// remote region's is left to a worker of its own, with the global rule
// alone (the regional rules would be a second region's whole rule).
func (w *world) startAgent(region string) *testAgent {
	t := w.t
	t.Helper()
	w.mu.Lock()
	name := fmt.Sprintf("a%d", len(w.agents)+1)
	w.mu.Unlock()
	a := &testAgent{name: name, region: region, rules: ruleNames()}
	if region != mainRegion {
		a.name, a.rules = region+"1", []string{globalRule}
	}
	name = a.name
	addrs := w.linkAgent(a)
	cfg := agent.DefaultConfig()
	cfg.AgentID = name
	cfg.Region = region
	cfg.RulesFile = w.rulesPath
	cfg.Redis = w.redisPx.Addr()
	cfg.Coordinators = strings.Join(addrs, ",")
	cfg.Insecure = true
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.DecisionTimeout = decisionTimeout
	cfg.ReloadInterval = reloadInterval
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("RATION_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	logger = logger.With("agent", name)
	// The lease holder the agent would build from cfg (internal/agent's
	// startLeases), but for IdleAfter: quotas unused for a few seconds are
	// released and subjects' copies of a default lease forgotten within
	// the run, not after a minute.
	client := coordclient.New(addrs, coordclient.Options{Logger: slog.New(countingHandler{next: logger.Handler(), w: w})})
	t.Cleanup(func() { _ = client.Close() })
	leases, err := holder.New(holder.Options{
		Client: client, Holder: name, Region: cfg.Region,
		ColdStart: cfg.DecisionTimeout, IdleAfter: idleAfter, Logger: logger,
	})
	if err != nil {
		t.Fatalf("agent %s: lease holder: %v", name, err)
	}
	srv, err := agent.Start(context.Background(), cfg, logger, leases)
	if err != nil {
		t.Fatalf("agent %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	a.srv = srv
	deadline := time.Now().Add(30 * time.Second)
	for !srv.Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("agent %s not ready after 30s", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.join(a, srv.GRPCAddr(), srv.HTTPAddr())
	w.event("agent %s of region %s started", name, region)
	return a
}

// linkAgent gives a its own proxy to each coordinator of its region's
// group and returns their addresses.
func (w *world) linkAgent(a *testAgent) []string {
	var addrs []string
	for _, up := range w.hier.Regions[a.region].GRPCAddrs() {
		p := harness.NewProxy(w.t, up)
		a.proxies = append(a.proxies, p)
		addrs = append(addrs, p.Addr())
	}
	return addrs
}

// join connects the callers' clients to a ready agent, listening on
// grpcAddr and httpAddr; an agent of the main region it hands to the
// workers and the schedule (the remote region's has a worker of its own).
func (w *world) join(a *testAgent, grpcAddr, httpAddr string) {
	t := w.t
	t.Helper()
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	a.rl, a.envoy = rationv1.NewRateLimiterClient(conn), rlsv3.NewRateLimitServiceClient(conn)
	a.base = "http://" + httpAddr
	a.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	t.Cleanup(a.http.CloseIdleConnections)
	if a.region == mainRegion {
		w.mu.Lock()
		w.agents = append(w.agents, a)
		w.mu.Unlock()
	}
}

// The decision entry points a caller can use.
var entryNames = []string{"Allow", "AllowBatch", "AllowStream", "ShouldRateLimit", "POST /v1/allow", "GET /v1/check"}

// item is one decision a caller asks for: one rule, one subject.
type item struct {
	rule, user string
	cost       float64
}

func (it item) descriptors() map[string]string {
	return map[string]string{"m": it.rule, "user": it.user}
}

// pick draws a decision: a subject of a random rule, with demand spread
// unevenly (one hot enough for mode auto to promote it, a tail of quiet
// ones whose leases stay full at the agents they seldom reach), and a
// new subject at freshShare.
func (w *world) pick(rnd *rand.Rand, a *testAgent, freshShare float64) item {
	it := item{rule: a.rules[rnd.IntN(len(a.rules))], cost: float64(1 + rnd.IntN(3))}
	// The remote region's one worker wants more of the hot subject than
	// its region's slice: the global group then gives it what a cut
	// region's lapsed upstream lease frees, and a cut region that kept
	// spending its slice would show.
	hot := 0.4
	if a.region != mainRegion {
		hot = 0.8
	}
	switch p := rnd.Float64(); {
	case p < freshShare:
		it.user = fmt.Sprintf("n%d", w.fresh.Add(1))
	case p < hot:
		it.user = "hot"
	default:
		// u0 half as likely as ... u5 a 32nd of the rest.
		k := 0
		for k < 5 && rnd.IntN(2) == 0 {
			k++
		}
		it.user = fmt.Sprintf("u%d", k)
	}
	return it
}

// pickFresh draws a new subject of a leased rule a's callers use: its
// first decision waits for its first grant.
func (w *world) pickFresh(rnd *rand.Rand, a *testAgent) item {
	leased := slices.DeleteFunc(slices.Clone(a.rules), func(n string) bool { return initialShapes[n].Mode != "leased" })
	return item{rule: leased[rnd.IntN(len(leased))], user: fmt.Sprintf("n%d", w.fresh.Add(1)), cost: 1}
}

// startLoad starts the callers: each worker calls a random agent through
// a random entry point, with a short random pause between calls.
func (w *world) startLoad(seed uint64) {
	// The remote region's agent has a worker of its own.
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		rnd := rand.New(rand.NewPCG(seed, workers+1))
		for {
			select {
			case <-w.stop:
				return
			default:
			}
			entry := entryNames[rnd.IntN(len(entryNames))]
			w.called(entry)
			w.call(rnd, w.remote, entry)
			time.Sleep(time.Duration(rnd.IntN(8)) * time.Millisecond)
		}
	}()
	for i := range workers {
		rnd := rand.New(rand.NewPCG(seed, uint64(i)+1))
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			// Each worker stays with one agent for a while, so that an
			// agent's load comes and goes (its leases fill while it is
			// quiet).
			var a *testAgent
			var until time.Time
			for {
				select {
				case <-w.stop:
					return
				default:
				}
				if r, ok := w.rushing(); ok && a != r && !r.quiet.Load() {
					// Every caller back at an agent just resumed from a
					// pause, while its timers and lease loop catch up.
					a, until = r, time.Now().Add(rushFor)
				} else if a == nil || a.quiet.Load() || time.Now().After(until) {
					w.mu.Lock()
					a = w.agents[rnd.IntN(len(w.agents))]
					for k := 0; a.quiet.Load() && k < len(w.agents); k++ {
						a = w.agents[(rnd.IntN(len(w.agents)))]
					}
					w.mu.Unlock()
					until = time.Now().Add(time.Duration(100+rnd.IntN(1400)) * time.Millisecond)
				}
				entry := entryNames[rnd.IntN(len(entryNames))]
				w.called(entry)
				w.call(rnd, a, entry)
				time.Sleep(time.Duration(rnd.IntN(8)) * time.Millisecond)
			}
		}()
	}
}

func (w *world) stopLoad() {
	close(w.stop)
	w.wg.Wait()
}

// call makes one call and records what it admitted. A call that fails
// (the agent's deadline, a transport error) admitted nothing the caller
// could act on.
func (w *world) call(rnd *rand.Rand, a *testAgent, entry string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.inflight.Add(1)
	defer a.inflight.Add(-1)
	switch entry {
	case "Allow":
		w.allowOne(ctx, rnd, a)
	case "AllowBatch":
		w.batch(ctx, rnd, a)
	case "AllowStream":
		w.stream(ctx, rnd, a)
	case "ShouldRateLimit":
		w.envoy(ctx, rnd, a)
	case "POST /v1/allow":
		w.postAllow(ctx, rnd, a)
	case "GET /v1/check":
		w.check(ctx, rnd, a)
	}
}

// allowOne asks Allow for one decision.
func (w *world) allowOne(ctx context.Context, rnd *rand.Rand, a *testAgent) {
	it := w.pick(rnd, a, 0.05)
	from := w.now()
	resp, err := a.rl.Allow(ctx, &rationv1.AllowRequest{Descriptors: it.descriptors(), Cost: it.cost})
	if err == nil {
		w.decided(a, "Allow", it, resp.Allowed, from, w.now())
	}
}

// batch asks AllowBatch for a new subject of a leased rule, up to two
// more new subjects, then 2 to 11 items: the new subjects wait for their
// first grants, and the items after them are decided after that wait.
func (w *world) batch(ctx context.Context, rnd *rand.Rand, a *testAgent) {
	items := []item{w.pickFresh(rnd, a)}
	for range rnd.IntN(3) {
		items = append(items, w.pick(rnd, a, 1))
	}
	for range 2 + rnd.IntN(10) {
		items = append(items, w.pick(rnd, a, 0))
	}
	req := &rationv1.AllowBatchRequest{}
	for _, it := range items {
		req.Requests = append(req.Requests, &rationv1.AllowRequest{Descriptors: it.descriptors(), Cost: it.cost})
	}
	from := w.now()
	resp, err := a.rl.AllowBatch(ctx, req)
	if err != nil {
		return
	}
	to := w.now()
	for i, r := range resp.Responses {
		w.decided(a, "AllowBatch", items[i], r.Allowed, from, to)
	}
}

// envoy asks ShouldRateLimit for one to three descriptors decided
// together: admitted only when all are (the others' charges are refunded
// otherwise).
func (w *world) envoy(ctx context.Context, rnd *rand.Rand, a *testAgent) {
	var items []item
	req := &rlsv3.RateLimitRequest{Domain: "bound"}
	for range 1 + rnd.IntN(3) {
		it := w.pick(rnd, a, 0.05)
		items = append(items, it)
		req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
			Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "m", Value: it.rule}, {Key: "user", Value: it.user}},
			HitsAddend: wrapperspb.UInt64(uint64(it.cost)),
		})
	}
	from := w.now()
	resp, err := a.envoy.ShouldRateLimit(ctx, req)
	if err != nil {
		return
	}
	to := w.now()
	if resp.OverallCode == rlsv3.RateLimitResponse_OK {
		for _, it := range items {
			w.admit(a, "ShouldRateLimit", it.rule, it.user, it.cost, from, to)
		}
		return
	}
	// Refused: a descriptor answered OVER_LIMIT was refused by its rule;
	// the others were refunded, neither admitted nor refused. Descriptors
	// of one (rule, user) are charged together, so one refused among them
	// is not a refusal of its own cost: such a call is not judged.
	seen := map[string]bool{}
	for _, it := range items {
		k := it.rule + "|" + it.user
		if seen[k] {
			return
		}
		seen[k] = true
	}
	for i, st := range resp.Statuses {
		if i < len(items) && st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			w.refuse(items[i], from, to)
		}
	}
}

// postAllow asks POST /v1/allow for one decision: admitted is 200 with
// "allowed": true.
func (w *world) postAllow(ctx context.Context, rnd *rand.Rand, a *testAgent) {
	it := w.pick(rnd, a, 0.05)
	body, _ := json.Marshal(map[string]any{"descriptors": it.descriptors(), "cost": it.cost})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, a.base+"/v1/allow", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	from := w.now()
	resp, err := a.http.Do(req)
	if err != nil {
		return
	}
	var ans struct {
		Allowed bool `json:"allowed"`
	}
	err = json.NewDecoder(resp.Body).Decode(&ans)
	resp.Body.Close()
	if err == nil && resp.StatusCode == http.StatusOK {
		w.decided(a, "POST /v1/allow", it, ans.Allowed, from, w.now())
	}
}

// check asks GET /v1/check for one decision: admitted is 200.
func (w *world) check(ctx context.Context, rnd *rand.Rand, a *testAgent) {
	it := w.pick(rnd, a, 0.05)
	q := url.Values{"m": {it.rule}, "user": {it.user}, "cost": {fmt.Sprint(it.cost)}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/v1/check?"+q.Encode(), nil)
	from := w.now()
	resp, err := a.http.Do(req)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		w.admit(a, "GET /v1/check", it.rule, it.user, it.cost, from, w.now())
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		w.refuse(it, from, w.now())
	}
}

// stream sends a few requests on one AllowStream; each answer is the
// decision of the request sent in its turn, so its span starts at that
// send.
func (w *world) stream(ctx context.Context, rnd *rand.Rand, a *testAgent) {
	s, err := a.rl.AllowStream(ctx)
	if err != nil {
		return
	}
	n := 1 + rnd.IntN(6)
	items := make([]item, n)
	sent := make([]time.Duration, n)
	for i := range n {
		items[i] = w.pick(rnd, a, 0.05)
		sent[i] = w.now()
		if err := s.Send(&rationv1.AllowRequest{Descriptors: items[i].descriptors(), Cost: items[i].cost}); err != nil {
			return
		}
	}
	_ = s.CloseSend()
	for i := range n {
		r, err := s.Recv()
		if err != nil {
			return
		}
		w.decided(a, "AllowStream", items[i], r.Allowed, sent[i], w.now())
	}
}

// metrics sums, over every agent, the hot promotions taken up and the
// decisions made on leases: whether the run reached those paths.
func (w *world) metrics() (promotions, leased float64) {
	for _, a := range append(slices.Clone(w.agents), w.remote) {
		if a.proc != nil {
			p, l := w.procMetrics(a)
			promotions, leased = promotions+p, leased+l
			continue
		}
		mfs, err := a.srv.Registry.Gather()
		if err != nil {
			w.t.Fatalf("agent %s metrics: %v", a.name, err)
		}
		for _, mf := range mfs {
			switch mf.GetName() {
			case "ration_agent_hot_promotions_total":
				for _, m := range mf.GetMetric() {
					promotions += m.GetCounter().GetValue()
				}
			case "ration_decisions_total":
				for _, m := range mf.GetMetric() {
					for _, l := range m.GetLabel() {
						if l.GetName() == "path" && l.GetValue() == "leased" {
							leased += m.GetCounter().GetValue()
						}
					}
				}
			}
		}
	}
	return promotions, leased
}

// upstreamFailures sums the regional nodes' failed upstream renewals:
// whether the region cuts reached the upstream lease. A node restarted
// by the schedule counts from its restart.
func (w *world) upstreamFailures() float64 {
	var n float64
	for _, g := range w.regionGroups() {
		for _, i := range g.Live() {
			mfs, err := g.Registry(i).Gather()
			if err != nil {
				w.t.Fatalf("coordinator metrics: %v", err)
			}
			for _, mf := range mfs {
				if mf.GetName() != "ration_coordinator_upstream_renewals_total" {
					continue
				}
				for _, m := range mf.GetMetric() {
					for _, l := range m.GetLabel() {
						if l.GetName() == "result" && l.GetValue() == "error" {
							n += m.GetCounter().GetValue()
						}
					}
				}
			}
		}
	}
	return n
}

// countingHandler counts what the agents' coordinator clients log of the
// faults they meet: a call retried (with the same sequence number) and a
// lease watch stream that ended. Both are logged at debug level, so it
// takes every record, and passes on what next takes.
type countingHandler struct {
	next slog.Handler
	w    *world
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	switch r.Message {
	case "coordinator call failed, retrying":
		h.w.retries.Add(1)
	case "lease watch stream ended":
		h.w.streamEnds.Add(1)
	}
	if h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{next: h.next.WithAttrs(as), w: h.w}
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	return countingHandler{next: h.next.WithGroup(name), w: h.w}
}
