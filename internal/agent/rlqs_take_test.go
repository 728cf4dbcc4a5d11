package agent_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// recordSlack is what the judge forgives of B + r*T in a window: a direct
// caller records its admission when its call returns, up to some
// milliseconds after the store decided it, so a window of records may
// hold what the store admitted over a slightly longer one. One token is
// 50ms of the rule's refill, far more than such a lag, and a quarter of
// what an Envoy spends twice without the hold
// (TestRLQSTakeHeldWhileEnvoyIdle: 4).
const recordSlack = 1.0

const takenRules = `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 40
    rate: 20
`

// Envoys on RLQS and direct callers share one mode redis subject on a real
// redis-server: 3 filter-like clients asking far more than the rule's rate,
// and 2 direct callers (Allow over gRPC, Decide in process) asking about
// two thirds of it, for a few seconds. Every assignment's whole cost is
// taken from the subject's Redis bucket before it is sent, and held there
// for as long as Envoy may spend it, so all they admitted together stays
// within B + r*T over every window.
func TestRLQSTakesRedisRuleWithinBound(t *testing.T) {
	const burst, rate = 40.0, 20.0
	a := startAgent(t, takenRules)
	rec := admission.NewRecorder()
	const quota = "per-user|user=a"
	id := map[string]string{"user": "a"}
	var clients []*harness.RLQSClient
	for i := range 3 {
		name := fmt.Sprintf("envoy-%d", i)
		clients = append(clients, harness.DialRLQS(t, a.srv.GRPCAddr(), "edge", 200*time.Millisecond, func() { rec.Admit(name, quota, 1) }))
	}
	const run = 4 * time.Second
	end := time.Now().Add(run)
	var wg sync.WaitGroup
	for _, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 4000 && time.Now().Before(end); n++ {
				cl.Request(id)
				time.Sleep(time.Millisecond)
			}
		}()
	}
	direct := []func() bool{
		func() bool { return a.allow(t, &rationv1.AllowRequest{Descriptors: id}).Allowed },
		func() bool {
			resp, err := a.srv.Service.Decide(context.Background(), agent.Request{Descriptors: id})
			if err != nil {
				t.Error(err)
			}
			return resp.Allowed
		},
	}
	for i, decide := range direct {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 100 && time.Now().Before(end); n++ {
				if decide() {
					rec.Admit(fmt.Sprintf("direct-%d", i), quota, 1)
				}
				time.Sleep(150 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	span := rec.Now()
	for _, cl := range clients {
		if err := cl.Err(); err != nil {
			t.Fatalf("client stream: %v", err)
		}
	}
	judgeTakes(t, rec.Records(), quota, burst, rate, span)
	if f := metricValue(t, a.srv.Registry, "ration_rlqs_takes_total", map[string]string{"outcome": "funded"}); f < 2 {
		t.Fatalf("%v funded takes: the clients' assignments were not taken", f)
	}
}

// judgeTakes holds the admissions of quota to B + r*T over the run (span:
// from before the first decision to after the last) and over every
// window (up to recordSlack), and asks that both the Envoys and the
// direct callers admitted something.
func judgeTakes(t *testing.T, recs []admission.Record, quota string, burst, rate float64, span time.Duration) {
	t.Helper()
	var envoy, direct float64
	for _, r := range recs {
		if strings.HasPrefix(r.Agent, "envoy") {
			envoy += r.Cost
		} else {
			direct += r.Cost
		}
	}
	bound := burst + rate*span.Seconds()
	strict := admission.Check(recs, quota, burst, rate)
	t.Logf("admitted %v by Envoys, %v directly, in %v (B + r*T = %.0f); overshoot %.2f of B + r*T in a window; utilisation %.2f",
		envoy, direct, span.Round(time.Millisecond), bound, strict.Overshoot, strict.Utilisation)
	if envoy+direct > bound {
		t.Fatalf("admitted %v in %v, more than B + r*T = %.1f", envoy+direct, span, bound)
	}
	if strict.Overshoot > recordSlack {
		t.Fatalf("admissions overshoot B + r*T by %.2f in a window (%v..%v), more than the %v tokens records may lag", strict.Overshoot, strict.From, strict.To, recordSlack)
	}
	if envoy < 1 || direct < 1 {
		t.Fatalf("admitted %v by Envoys and %v directly: both must have been funded", envoy, direct)
	}
}

// metricSum adds the series of name whose labels include labels.
func metricSum(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// TestRLQSTakeHeldWhileEnvoyIdle walks the case the hold is for: an
// Envoy gets a taken assignment and goes idle; the subject's bucket would
// refill to B behind it within a second; then, before the assignment
// lapses, the Envoy spends all it holds while a direct caller drains the
// bucket. Held, the bucket refilled only to B less the assignment's cost,
// and the two together stay within B + r*T in every window.
func TestRLQSTakeHeldWhileEnvoyIdle(t *testing.T) {
	const burst, rate = 40.0, 20.0
	a := startAgent(t, takenRules)
	rec := admission.NewRecorder()
	const quota = "per-user|user=idle"
	id := map[string]string{"user": "idle"}
	cl := harness.DialRLQS(t, a.srv.GRPCAddr(), "edge", 200*time.Millisecond, func() { rec.Admit("envoy", quota, 1) })
	funded := func() float64 {
		return metricValue(t, a.srv.Registry, "ration_rlqs_takes_total", map[string]string{"outcome": "funded"})
	}
	// Demand of some 30 requests a second asks for more than half the
	// bucket can fund: the assignment is cut to about half the burst.
	for n := 0; n < 30; n++ {
		cl.Request(id)
		time.Sleep(time.Millisecond)
	}
	// The first assignment lasts 1s; wait for the one sized on the
	// reported demand (the second take), then stay idle.
	deadline := time.Now().Add(5 * time.Second)
	for funded() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if funded() < 2 {
		t.Fatalf("%v funded takes after 5s: the client's assignment was never renewed", funded())
	}
	// Unheld, the bucket is full again within a second of the take.
	time.Sleep(1100 * time.Millisecond)
	var envoy, direct int
	for n := 0; n < 100 && cl.Request(id); n++ {
		envoy++
	}
	for n := 0; n < 100; n++ {
		if !a.allow(t, &rationv1.AllowRequest{Descriptors: id}).Allowed {
			break
		}
		rec.Admit("direct", quota, 1)
		direct++
	}
	if err := cl.Err(); err != nil {
		t.Fatalf("client stream: %v", err)
	}
	strict := admission.Check(rec.Records(), quota, burst, rate)
	t.Logf("at the end: the idle Envoy spent %d, a direct caller %d; overshoot %.2f of B + r*T in a window (%v..%v)",
		envoy, direct, strict.Overshoot, strict.From, strict.To)
	if envoy < 1 {
		t.Fatalf("the Envoy spent nothing of its assignment (kind %q)", cl.Kind(id))
	}
	if strict.Overshoot > recordSlack {
		t.Fatalf("admissions overshoot B + r*T by %.2f in a window (%v..%v): the bucket refilled behind tokens Envoy had yet to spend", strict.Overshoot, strict.From, strict.To)
	}
}

// A steady Envoy on a taken bucket costs one take per assignment, and an
// assignment is re-sent only when it would lapse before the next report:
// at 100ms reports and a 2s TTL, about one take per 1.6s, not ten a
// second. Takes are counted as the rule's store decisions (one script call
// each).
func TestRLQSTakesOncePerAssignment(t *testing.T) {
	a := startAgent(t, `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 200
    rate: 100
`)
	cl := harness.DialRLQS(t, a.srv.GRPCAddr(), "edge", 100*time.Millisecond, nil)
	id := map[string]string{"user": "steady"}
	end := time.Now().Add(3 * time.Second)
	for n := 0; n < 300 && time.Now().Before(end); n++ {
		cl.Request(id)
		time.Sleep(10 * time.Millisecond)
	}
	if err := cl.Err(); err != nil {
		t.Fatal(err)
	}
	takes := metricSum(t, a.srv.Registry, "ration_decisions_total", map[string]string{"rule": "per-user", "path": "store"})
	reports := cl.Reports()
	allowed, denied := cl.Decisions()
	t.Logf("%v takes for %d reports; the client allowed %d, denied %d", takes, reports, allowed, denied)
	if takes < 1 || allowed == 0 {
		t.Fatalf("%v takes, %d allowed: the bucket was never funded", takes, allowed)
	}
	if takes > float64(reports)/5 {
		t.Fatalf("%v takes for %d reports: a steady bucket is taken for about once a TTL, not once a report", takes, reports)
	}
}

// With the store down (its redis-server killed), a mode redis rule's
// assignments are its failure policy's: fail_closed denies, fail_open
// admits, and local_emergency sends token buckets whose takes the agent's
// emergency bucket pays for, so what the Envoys admit stays within that
// bucket's burst + rate*T.
func TestRLQSTakenFailurePolicies(t *testing.T) {
	a := startAgent(t, `
rules:
  - name: closed
    match: {closed: "*"}
    burst: 40
    rate: 20
    on_failure: fail_closed
  - name: open
    match: {open: "*"}
    burst: 40
    rate: 20
    on_failure: fail_open
  - name: emergency
    match: {emerg: "*"}
    burst: 40
    rate: 20
    on_failure: emergency
    emergency: {burst: 10, rate: 5, max_duration: 1m}
`)
	a.redis.Kill()
	rec := admission.NewRecorder()
	const quota = "emergency|emerg=a"
	var clients []*harness.RLQSClient
	for i := range 2 {
		name := fmt.Sprintf("envoy-%d", i)
		clients = append(clients, harness.DialRLQS(t, a.srv.GRPCAddr(), "edge", 200*time.Millisecond, func() { rec.Admit(name, quota, 1) }))
	}
	other := harness.DialRLQS(t, a.srv.GRPCAddr(), "edge", 200*time.Millisecond, nil)
	closed, open, emerg := map[string]string{"closed": "a"}, map[string]string{"open": "a"}, map[string]string{"emerg": "a"}
	kinds := map[string]map[string]bool{"closed": {}, "open": {}, "emerg": {}}
	end := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for _, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 3000 && time.Now().Before(end); n++ {
				cl.Request(emerg)
				time.Sleep(time.Millisecond)
			}
		}()
	}
	for n := 0; n < 300 && time.Now().Before(end); n++ {
		for name, id := range map[string]map[string]string{"closed": closed, "open": open} {
			other.Request(id)
			kinds[name][other.Kind(id)] = true
		}
		// The two Envoys race for one emergency bucket; either may win
		// every take, so both are watched.
		for _, cl := range clients {
			kinds["emerg"][cl.Kind(emerg)] = true
		}
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	span := rec.Now()
	for _, cl := range append(clients, other) {
		if err := cl.Err(); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string]string{"closed": "deny_all", "open": "allow_all", "emerg": "token_bucket"} {
		// Before its first assignment a bucket has none (""); an empty
		// emergency bucket denies for a while.
		delete(kinds[name], "")
		if name == "emerg" {
			delete(kinds[name], "deny_all")
		}
		if !kinds[name][want] || len(kinds[name]) != 1 {
			t.Fatalf("bucket %s had assignments %v; want %s", name, kinds[name], want)
		}
	}
	emergency := metricSum(t, a.srv.Registry, "ration_decisions_total", map[string]string{"rule": "emergency", "path": "fallback", "result": "allowed", "reason": "emergency"})
	rep := admission.Check(rec.Records(), quota, 10, 5)
	t.Logf("emergency: %v takes charged to the emergency bucket; the Envoys admitted %v in %v (10 + 5*T = %.1f)", emergency, rep.Admitted, span.Round(time.Millisecond), 10+5*span.Seconds())
	if emergency < 1 {
		t.Fatal("no take was charged to the emergency bucket")
	}
	if rep.Admitted > 10+5*span.Seconds() {
		t.Fatalf("the Envoys admitted %v under local_emergency in %v, more than its bucket's 10 + 5*T", rep.Admitted, span)
	}
}

// takenAutoRules is a mode auto rule whose promotions' marks last hold.
func takenAutoRules(hold string) string {
	return `
rules:
  - name: api
    match: {tenant: "*"}
    burst: 100
    rate: 100
    mode: auto
    auto: {promote_above: 40, demote_below: 10, hold: ` + hold + `}
    lease: {period: 2s}
`
}

// A mode auto subject promoted by its direct traffic is decided on the
// promotion's lease, and so is an RLQS bucket of it: the bucket's takes
// are lent from that lease (the admission log shows them on path leased,
// at their cost), and the Envoy's and the direct callers' admissions stay
// within B + r*T over every window. A take is held for its assignment's
// life, which must end before the promotion's mark can lapse: with the
// default hold (2s) takes of a 1s TTL fit; a mark of 400ms funds none
// (the bucket is denied while the subject is promoted), though the lease
// itself would.
func TestRLQSTakesFromPromotedSubject(t *testing.T) {
	for _, tt := range []struct {
		hold  string
		taken bool
	}{{"2s", true}, {"400ms", false}} {
		t.Run("hold "+tt.hold, func(t *testing.T) { takesFromPromotedSubject(t, tt.hold, tt.taken) })
	}
}

func takesFromPromotedSubject(t *testing.T, hold string, wantTaken bool) {
	rulesYAML := takenAutoRules(hold)
	c := harness.StartCoordinators(t, 1, rulesYAML)
	log := filepath.Join(t.TempDir(), "admissions.log")
	a := startAgent(t, rulesYAML, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
		cfg.Record = log
	})
	rec := admission.NewRecorder()
	const quota = "api|tenant=hot"
	id := map[string]string{"tenant": "hot"}
	// ~80 direct decisions a second, above promote_above, below the rate.
	stop := time.Now().Add(5 * time.Second)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for n := 0; n < 100 && time.Now().Before(stop); n++ {
				<-tick.C
				if a.allow(t, &rationv1.AllowRequest{Descriptors: id}).Allowed {
					rec.Admit(fmt.Sprintf("direct-%d", g), quota, 1)
				}
			}
		}()
	}
	waitFor(t, "a promotion", func() bool {
		return metricValue(t, a.srv.Registry, "ration_agent_hot_promotions_total", nil) >= 1
	})
	cl := harness.DialRLQS(t, a.srv.GRPCAddr(), "edge", 200*time.Millisecond, func() { rec.Admit("envoy", quota, 1) })
	for n := 0; n < 2000 && time.Now().Before(stop); n++ {
		cl.Request(id)
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	span := rec.Now()
	if err := cl.Err(); err != nil {
		t.Fatal(err)
	}
	taken := lentTakes(t, log)[quota]
	t.Logf("%d takes on the promotion's lease", taken)
	if wantTaken && taken == 0 {
		t.Fatalf("no take on the promotion's lease in the admission log")
	}
	if !wantTaken && taken > 0 {
		t.Fatalf("%d takes on the promotion's lease, held longer than its %s mark", taken, hold)
	}
	if wantTaken {
		judgeTakes(t, rec.Records(), quota, 100, 100, span)
		return
	}
	if rep := admission.Check(rec.Records(), quota, 100, 100); rep.Overshoot > recordSlack {
		t.Fatalf("admissions overshoot B + r*T by %.2f in a window (%v..%v)", rep.Overshoot, rep.From, rep.To)
	}
}

// The -rlqs-* flags reach the RLQS server: -rlqs-take-ttl is the TTL of a
// taken assignment (after a bucket's first, which lasts 1s), and
// -rlqs-max-buckets ends a stream that reports more buckets.
func TestRLQSFlagsApply(t *testing.T) {
	a := startAgent(t, takenRules, func(c *agent.Config) {
		c.RLQS.MaxTTL, c.RLQS.TakeTTL, c.RLQS.MaxBuckets = 4*time.Second, 3*time.Second, 2
	})
	s := openRLQS(t, a)
	report := func(users ...string) *rlqsv3.RateLimitQuotaUsageReports {
		r := &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge"}
		for _, u := range users {
			r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"user": u}}, NumRequestsAllowed: 1, TimeElapsed: durationpb.New(time.Second)})
		}
		return r
	}
	var ttls []int64
	for i := range 2 {
		if i > 0 {
			// The first assignment (1s) is then about to lapse: renewed.
			time.Sleep(800 * time.Millisecond)
		}
		if err := s.Send(report("a")); err != nil {
			t.Fatal(err)
		}
		resp, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		qa := resp.GetBucketAction()[0].GetQuotaAssignmentAction()
		if qa.GetRateLimitStrategy().GetTokenBucket() == nil {
			t.Fatalf("action %d: %v, want a token bucket", i, qa)
		}
		ttls = append(ttls, qa.GetAssignmentTimeToLive().GetSeconds())
	}
	if ttls[0] != 1 || ttls[1] != 3 {
		t.Fatalf("taken assignments' TTLs %v, want [1 3] (-rlqs-take-ttl 3s)", ttls)
	}
	if err := s.Send(report("a", "b", "c")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); status.Code(err) == codes.OK || !strings.Contains(err.Error(), "at most 2") {
		t.Fatalf("a report of 3 buckets under -rlqs-max-buckets 2: %v, want the stream ended naming the bound", err)
	}
}
