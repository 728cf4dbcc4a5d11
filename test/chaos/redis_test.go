package chaos

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// S10: Redis blackholed (both directions, connections left hanging) for
// P = 3s under load, on the Redis path, with one rule per policy. Two
// agents reach Redis through the one proxy, so N = 2 are cut off.
//
// Bounds: fail_closed 0; emergency N x (b_e + r_e x P_eff) with P_eff =
// P + the breaker's probe interval (the agents go on deciding by policy
// until a probe answers after the heal); fail_open reported, unbounded.
// Decisions stop waiting once the breaker opens: of the calls started
// more than 1s into the outage, under 2% take as long as the decision
// timeout.
//
// Protection off (RATION_CHAOS_BREAK=S10): the breaker never opens
// (-breaker-threshold 1000000), so every decision waits out its timeout;
// the latency check fails (measured: see docs/reliability.md).
func TestS10RedisBlackholed(t *testing.T) {
	scenario(t)
	r := rng(t)
	const (
		be, re     = 5.0, 10.0
		outage     = 3 * time.Second
		probe      = 500 * time.Millisecond
		decisionTO = 50 * time.Millisecond
	)
	const rulesYAML = `
rules:
  - name: s10-closed
    match: {s10: closed}
    burst: 20
    rate: 100
    on_failure: fail_closed
  - name: s10-emergency
    match: {s10: emergency}
    burst: 20
    rate: 100
    on_failure: emergency
    emergency: {burst: 5, rate: 10, max_duration: 30s}
  - name: s10-open
    match: {s10: open}
    burst: 20
    rate: 100
    on_failure: fail_open
`
	redis := harness.StartRedis(t)
	px := harness.NewProxy(t, redis.Addr)
	args := []string{"-decision-timeout", decisionTO.String(), "-breaker-probe-interval", probe.String()}
	if broken("S10") {
		t.Log("chaos: S10 protection removed: the breaker never opens")
		args = append(args, "-breaker-threshold", "1000000")
	}
	var agents []*Agent
	for i := range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s10a%d", i), Rules: rulesYAML, Redis: px.Addr(), Args: args}))
	}
	var targets []Target
	for _, rule := range []string{"s10-closed", "s10-emergency", "s10-open"} {
		targets = append(targets, loadOn(rule, "x", true, agents...)...)
	}
	l := StartLoad(targets)
	time.Sleep(2*time.Second + time.Duration(r.Int64N(int64(time.Second))))
	cut := mono()
	px.Blackhole()
	time.Sleep(outage)
	px.Heal()
	healed := mono()
	// Long enough after the heal for the recovery window below: a probe
	// may first meet pooled connections the blackhole left dead (each
	// fails one probe, after the decision timeout) before a fresh dial.
	// And long enough that the utilisation floors are held over a run
	// where the outage and the recovery are not most of it: on a loaded
	// machine (make test, two cores) the agents took up to about 2s after
	// the heal to admit on the Redis path at full rate again, and with 3s
	// after the heal s10-closed measured 0.365 in one run (floor 0.40).
	time.Sleep(5 * time.Second)
	calls := l.Stop()
	recs := readRecords(t, agents...)

	n := float64(len(agents))
	pEff := (healed - cut + probe).Seconds()
	bounds := map[string]float64{"s10-closed": 0, "s10-emergency": n * (be + re*pEff), "s10-open": math.Inf(1)}
	labels := map[string]string{"s10-closed": "0", "s10-emergency": fmt.Sprintf("N(b_e + r_e P) = %.0f", n*(be+re*pEff)), "s10-open": "unbounded (reported)"}
	for _, rule := range []string{"s10-closed", "s10-emergency", "s10-open"} {
		q := quota(rule, "x")
		j := judgeBoth(recs, calls, nil, Spec{Quota: q, Burst: burst, Rate: rate, Bound: bounds[rule], FailClosed: rule == "s10-closed"})
		floor := s10Util[rule]
		ok := j.Util() >= floor
		if !ok {
			t.Errorf("%s: utilisation %.3f, want >= %.2f", rule, j.Util(), floor)
		}
		// Recovery: once a probe answers after the heal, each agent
		// admits on the Redis path again.
		var back []string
		for _, a := range agents {
			got := admittedIn(recs, q, a.ID, "store", healed, healed+probe+2*time.Second)
			back = append(back, fmt.Sprintf("%s %.0f", a.ID, got))
			if got == 0 {
				ok = false
				t.Errorf("%s: agent %s admitted nothing on the Redis path within %v of the heal", rule, a.ID, probe+2*time.Second)
			}
		}
		judgedRow(t, "S10 "+rule[4:], fmt.Sprintf("Redis blackholed %v, N=2", outage),
			fmt.Sprintf("%s; utilisation >= %.2f; Redis path admits again within %v of the heal", labels[rule], floor, probe+2*time.Second),
			j, j.Util(), ok, fmt.Sprintf("admitted on the Redis path within %v of the heal: %s", probe+2*time.Second, strings.Join(back, ", ")))
	}
	// The breaker, judged on the agents' own measure of each decision
	// (its record's latency: from the batch's start to its verdict), not
	// on the clients' send-to-answer time: the test process runs under
	// -race and shares two cores with other tests, so its own scheduling
	// delays alone put a few percent of answers past 50ms (2.3% in one
	// make test run) while the agents decided them in microseconds.
	var late, waited int
	for _, rec := range recs {
		if rec.At > cut+time.Second && rec.At < healed {
			late++
			if rec.Latency >= decisionTO {
				waited++
			}
		}
	}
	var clientLate, clientWaited int
	for _, c := range calls {
		if c.Start > cut+time.Second && c.End < healed {
			clientLate++
			if c.End-c.Start >= decisionTO {
				clientWaited++
			}
		}
	}
	frac := float64(waited) / math.Max(float64(late), 1)
	ok := late > 100 && frac < 0.02
	addRow(t, Row{Scenario: "S10 breaker", Fault: "Redis blackholed", Bound: "< 2% of decisions wait the timeout once open (the agents' recorded latency)",
		Overshoot: 0, Util: math.NaN(), Pass: ok, Note: fmt.Sprintf("%d of %d decisions took >= %v in the agents (%.1f%%); as the clients timed them, send to answer: %d of %d",
			waited, late, decisionTO, 100*frac, clientWaited, clientLate)})
	if !ok {
		t.Errorf("after the breaker should be open, %d of %d decisions took >= %v in the agents (%.1f%%), want < 2%%", waited, late, decisionTO, 100*frac)
	}
}

// s10Util is S10's utilisation floor per rule over the whole run (about
// 2.5s of load, 3s of outage, 5s after the heal): fail_closed and
// emergency admit about nothing, resp. little, for the outage and the
// probe after it, so about half the run's budget; fail_open admits what
// is offered during the outage, three times the rate.
var s10Util = map[string]float64{"s10-closed": 0.4, "s10-emergency": 0.45, "s10-open": 0.9}

// S11: Redis replies lost after the script ran (the reply direction is
// blackholed in 300ms bursts), every request retried with its request id
// until it gets a definite answer. The quota (B = 30, r = 0) is offered 90
// distinct requests: each must be charged once, so exactly 30 distinct
// requests end admitted (a double charge would leave fewer; a lost
// charge, more), and the recorded history, a retry counted once, has
// overshoot 0.
//
// Protection off (RATION_CHAOS_BREAK=S11): retries take a fresh request
// id, so requests whose first attempt ran but lost its reply are charged
// again; fewer than 30 end admitted.
func TestS11LostReplies(t *testing.T) {
	scenario(t)
	r := rng(t)
	const rulesYAML = `
rules:
  - name: s11
    match: {s11: x}
    burst: 30
    rate: 0
`
	const B, total = 30, 90
	redis := harness.StartRedis(t)
	px := harness.NewProxy(t, redis.Addr)
	a := StartAgent(t, AgentOptions{ID: "s11a", Rules: rulesYAML, Redis: px.Addr(),
		Args: []string{"-decision-timeout", "50ms", "-breaker-probe-interval", "100ms"}})
	fresh := broken("S11")
	if fresh {
		t.Log("chaos: S11 protection removed: retries use a fresh request id")
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		for ctx.Err() == nil {
			px.Blackhole(harness.Downstream)
			time.Sleep(300 * time.Millisecond)
			px.Heal()
			time.Sleep(time.Duration(200+r.IntN(200)) * time.Millisecond)
		}
	}()

	ids := make(chan int, total)
	for i := range total {
		ids <- i
	}
	close(ids)
	var mu sync.Mutex
	var admitted, rejected, retriedThenAdmitted, attempts int
	var calls []Call      // every attempt, for the cross-check
	var obs []observation // each request once, for the client judge
	var wg sync.WaitGroup
	deadline := time.Now().Add(60 * time.Second)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ids {
				logical := fmt.Sprintf("s11-%d-%d", seedValue, i)
				o := observation{ID: logical, Start: mono(), Cost: 1, Quota: quota("s11", "x"), Burst: B, AgentID: a.ID}
				for try := 0; time.Now().Before(deadline); try++ {
					id := logical
					if fresh && try > 0 {
						id = fmt.Sprintf("%s-retry%d", id, try)
					}
					cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
					c := Call{Start: mono(), RequestID: id, AgentID: a.ID, Rule: "s11", Subj: "x"}
					resp, err := a.Client.Allow(cctx, &rationv1.AllowRequest{Rule: "s11", Subject: "x", RequestId: id})
					c.End = mono()
					ccancel()
					if err != nil {
						c.Err = err
					} else {
						c.Allowed, c.Reason = resp.Allowed, resp.Reason
					}
					mu.Lock()
					attempts++
					calls = append(calls, c)
					mu.Unlock()
					o.AttemptCount++
					if err == nil && (resp.Allowed || resp.Reason == rationv1.Reason_REASON_OVER_LIMIT) {
						mu.Lock()
						if resp.Allowed {
							admitted++
							o.Allowed, o.End = true, c.End
							if try > 0 {
								retriedThenAdmitted++
							}
						} else {
							rejected++
						}
						obs = append(obs, o)
						mu.Unlock()
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				time.Sleep(30 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	cancel()
	<-faultsDone
	px.Heal()

	recs := readRecords(t, a)
	j := judgeBoth(recs, calls, obs, Spec{Quota: quota("s11", "x"), Burst: B, Rate: 0, FailClosed: true})
	// Exactly B admitted is the utilisation floor too: 1.0.
	ok := admitted == B && admitted+rejected == total
	judgedRow(t, "S11", "Redis replies lost, retried with the same id", "0; each request charged once; exactly B admitted (utilisation 1)",
		j, j.Util(), ok, fmt.Sprintf("%d/%d admitted (want %d), %d admitted on a retry, %d attempts, %d repeats deduplicated", admitted, total, B, retriedThenAdmitted, attempts, j.Logs.Repeats))
	if !ok {
		t.Errorf("admitted %d distinct requests (want exactly %d), %d rejected of %d", admitted, B, rejected, total)
	}
}
