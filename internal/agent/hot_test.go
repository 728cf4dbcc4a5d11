package agent_test

import (
	"context"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

const autoRules = `
rules:
  - name: api
    match: {tenant: "*"}
    burst: 100
    rate: 100
    mode: auto
    auto: {promote_above: 60, demote_below: 20, hold: 400ms}
    lease: {period: 2s}
`

// TestAutoPromotesAndDemotes: two agents on one Redis and a real 3-node
// coordinator group. A subject driven past promote_above through both
// agents moves to leases (decided on path leased, its Redis key no longer
// charged), a quiet subject stays on Redis, the hot subject's admissions
// over the whole run stay within B + r*T, and once its traffic falls below
// demote_below it is decided on Redis again.
func TestAutoPromotesAndDemotes(t *testing.T) {
	c := harness.StartCoordinators(t, 3, autoRules)
	r := harness.StartRedis(t)
	coords := func(cfg *agent.Config) { cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",") }
	agents := []*testAgent{startAgentOn(t, r.Addr, autoRules, coords), startAgentOn(t, r.Addr, autoRules, coords)}

	hot := &rationv1.AllowRequest{Descriptors: map[string]string{"tenant": "hot"}}
	quiet := &rationv1.AllowRequest{Descriptors: map[string]string{"tenant": "quiet"}}

	// ~300 decisions/s of the hot subject for 3s, half through each agent
	// (bounded in count and time), and 5/s of the quiet one.
	var admitted, calls atomic.Int64
	start := time.Now()
	stop := start.Add(3 * time.Second)
	var wg sync.WaitGroup
	for g := 0; g < 6; g++ {
		a := agents[g%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for i := 0; i < 200 && time.Now().Before(stop); i++ {
				<-tick.C
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := a.rl.Allow(ctx, hot)
				cancel()
				if err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
				calls.Add(1)
				if resp.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	for i := 0; i < 15 && time.Now().Before(stop); i++ {
		if resp := agents[i%2].allow(t, quiet); !resp.Allowed {
			t.Fatalf("quiet subject denied: %v", resp)
		}
		time.Sleep(200 * time.Millisecond)
	}
	wg.Wait()
	elapsed := time.Since(start)

	// The bound, from the rule's constants: B + r*T over the whole run.
	if bound := 100 + 100*elapsed.Seconds(); float64(admitted.Load()) > bound {
		t.Fatalf("hot subject: %d admitted in %v, more than B + r*T = %.0f", admitted.Load(), elapsed, bound)
	}
	// And the budget was used: demand (~300/s) is three times the rate.
	if floor := 0.6 * 100 * elapsed.Seconds(); float64(admitted.Load()) < floor {
		t.Fatalf("hot subject: %d admitted of %d calls in %v; want at least %.0f (60%% of r*T)", admitted.Load(), calls.Load(), elapsed, floor)
	}
	var leased, promotions float64
	for _, a := range agents {
		for _, res := range []string{"allowed", "denied"} {
			for _, reason := range []string{"ok", "over_limit"} {
				leased += metricValue(t, a.srv.Registry, "ration_decisions_total",
					map[string]string{"rule": "api", "path": "leased", "result": res, "reason": reason})
			}
		}
		promotions += metricValue(t, a.srv.Registry, "ration_agent_hot_promotions_total", nil)
	}
	if leased < float64(calls.Load())/2 || promotions < 1 {
		t.Fatalf("%v of %d hot decisions on leases, %v promotions taken up; want most on leases", leased, calls.Load(), promotions)
	}
	t.Logf("hot subject: %d calls in %v, %d admitted (B + r*T = %.0f), %v on leases, %v promotions taken up",
		calls.Load(), elapsed.Round(time.Millisecond), admitted.Load(), 100+100*elapsed.Seconds(), leased, promotions)
	// The quiet subject never left Redis.
	if v := metricValue(t, agents[0].srv.Registry, "ration_decisions_total",
		map[string]string{"rule": "api", "path": "store", "result": "allowed", "reason": "ok"}); v < 5 {
		t.Fatalf("store decisions on agent 0 = %v; the quiet subject should be decided on Redis", v)
	}

	// Cooled (a decision every 200ms, 5/s < demote_below 20): the marks
	// stop being extended, the promotion lapses within a hold or so, and
	// the subject is decided on Redis again.
	storeHot := func() float64 {
		var n float64
		for _, a := range agents {
			for _, res := range []string{"allowed", "denied"} {
				for _, reason := range []string{"ok", "over_limit"} {
					n += metricValue(t, a.srv.Registry, "ration_decisions_total",
						map[string]string{"rule": "api", "path": "store", "result": res, "reason": reason})
				}
			}
		}
		return n
	}
	before := storeHot()
	deadline := time.Now().Add(10 * time.Second)
	for storeHot() < before+3 {
		if time.Now().After(deadline) {
			t.Fatalf("the hot subject was not demoted within 10s of cooling (store decisions %v -> %v)", before, storeHot())
		}
		agents[0].allow(t, hot)
		time.Sleep(200 * time.Millisecond)
	}
	// No fault, so no decision fell to the failure policy, through the
	// promotion and the demotion alike.
	for i, a := range agents {
		for _, res := range []string{"allowed", "denied"} {
			if v := metricValue(t, a.srv.Registry, "ration_decisions_total",
				map[string]string{"rule": "api", "path": "fallback", "result": res, "reason": "unavailable"}); v != 0 {
				t.Errorf("agent %d: %v decisions by the failure policy (%s) without any fault", i, v, res)
			}
		}
	}
	// And it is the hot-key bucket that decides it again: its key exists
	// and holds no live mark.
	ctx := context.Background()
	lu, err := r.Client().HGet(ctx, bucket.HotKey("api", "tenant=hot"), "lu").Result()
	if err == nil {
		t.Fatalf("after demotion the bucket still holds a mark lu=%s", lu)
	}
}

// TestAutoWithoutLeases: an agent with no coordinator (Leases nil) whose
// store promotes a subject cannot spend the promotion's lease: the
// subject's decisions fall to the rule's failure policy (fail_closed:
// unavailable) while the mark lives, never to a denial that looks like
// "over limit", and never to a Redis decision that ignores the mark.
func TestAutoWithoutLeases(t *testing.T) {
	set, err := rules.Parse("auto.yaml", []byte(autoRules))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := agent.New(agent.Options{Rules: agent.StaticRules{Set: set}, Store: bucket.NewMemoryStore(nil), DecisionTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req := agent.Request{Descriptors: map[string]string{"tenant": "t"}}
	reasons := map[agent.Reason]int{}
	for range 200 { // promote_above 60: promoted within the first ~61
		resp, err := svc.Decide(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		reasons[resp.Reason]++
	}
	if reasons[agent.ReasonUnavailable] == 0 || reasons[agent.ReasonOK] < 50 || reasons[agent.ReasonOK] > 100 {
		t.Fatalf("reasons %v: want the store's admissions until the promotion, then the failure policy", reasons)
	}
}

// switchRules is a RuleSource an operator's reload changes.
type switchRules struct{ p atomic.Pointer[rules.Set] }

func (s *switchRules) Current() *rules.Set { return s.p.Load() }

// TestModeChangeStartsAfresh: a rule switched between mode redis and mode
// auto (a rules reload, same name and shape) decides each mode's subjects
// from buckets of its own (bucket.HotKey), as docs/configuration.md says:
// the first switch to auto starts the subject's bucket full, a switch back
// finds the mode-redis bucket as it was left, and no decision goes to the
// failure policy on the way.
func TestModeChangeStartsAfresh(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t)
	client, err := bucket.OpenRedis(srv.Addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	auto := map[string]string{"redis": "\n", "auto": "\n    auto: {promote_above: 100000}\n"}
	parse := func(mode string) *rules.Set {
		t.Helper()
		set, err := rules.Parse("mode.yaml", []byte(`
rules:
  - name: api
    match: {tenant: "*"}
    burst: 100
    rate: 0.01
    on_failure: fail_closed
    mode: `+mode+auto[mode]))
		if err != nil {
			t.Fatal(err)
		}
		return set
	}
	src := new(switchRules)
	src.p.Store(parse("redis"))
	svc, err := agent.New(agent.Options{Rules: src, Store: bucket.NewRedisStore(client, bucket.RedisOptions{}), DecisionTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req := agent.Request{Descriptors: map[string]string{"tenant": "t"}}
	left := map[string]float64{"redis": 100, "auto": 100} // each mode's own bucket
	for _, mode := range []string{"redis", "auto", "redis", "auto"} {
		src.p.Store(parse(mode))
		for range 3 {
			left[mode]--
			resp, err := svc.Decide(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			// rate 0.01/s: a token refills in 100 s, not during the test
			if want := left[mode]; !resp.Allowed || resp.Reason != agent.ReasonOK || math.Floor(resp.Remaining) != want {
				t.Fatalf("mode %s: %+v; want admitted from its own bucket, about %v left", mode, resp, want)
			}
		}
	}
}
