package chaos

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/harness"
)

// S20's shape: S18's rule (mode auto, fail_closed, B = 20, r = 20/s,
// promoted at 30/s, hold 500ms, 2s leases) on a Redis primary with one
// replica, the agents reaching the primary through a proxy. The subject
// is cold (4.5/s) long enough to be replicated; then the replica's
// link is cut (blackholed: it receives nothing more), the subject turns hot (60/s
// over two agents) and is promoted on the primary alone; s20Leased later
// the primary is killed, the replica made primary (REPLICAOF
// NO ONE) and the proxy moved to it. The new primary never saw the mark:
// it decides the subject from its state before the promotion while the
// agents still hold marks. A third agent takes a share of the traffic
// from then on, for s20After.
const (
	s20Burst  = 20.0
	s20Rate   = 20.0
	s20Hold   = 500 * time.Millisecond
	s20Cold   = 1500 * time.Millisecond
	s20Leased = 2500 * time.Millisecond
	s20After  = 3 * time.Second
)

var s20Rules = fmt.Sprintf(`
rules:
  - name: s20
    match: {tenant: "*"}
    burst: %g
    rate: %g
    mode: auto
    on_failure: fail_closed
    auto: {promote_above: 30, demote_below: 10, hold: %v}
    lease: {period: 2s}
`, s20Burst, s20Rate, s20Hold)

// S20: mode auto through a Redis failover that loses the promotion's mark
// (replica lag made certain by cutting the replica's link before the
// promotion). The stated allowance (docs/failure-policies.md, Redis
// failover): a window containing the failover admits at most B + r hold
// more than B + r T, the agents spending the promotion's lease only under
// the marks they were told of (until a hold after the last extension, or
// at once when the new primary answers "gone"). Both judges hold the
// subject to that allowance, and to the plain bound in the windows before
// the kill and from a hold after the failover. The scenario checks that
// the subject was promoted after the replica's link was cut and before
// the kill, and that the new primary decided it from its older state (a
// decision on Redis right after the failover: the mark was lost).
//
// Break: RATION_CHAOS_BREAK=S20 builds the agents to spend a promotion's
// lease for as long as the lease is valid, whatever the mark and a "gone"
// (codeBreaks): the leased and the Redis histories then overlap for the
// rest of the run.
func TestS20AutoFailoverLosesMark(t *testing.T) {
	scenario(t)
	r := rng(t)
	coords := StartCoordinatorProcs(t, 1, s20Rules)
	primary := harness.StartRedis(t, harness.WithConfig("repl-diskless-sync-delay 0"))
	// The replica replicates through a proxy, so that its link can be cut
	// for certain: a replica merely stopped (SIGSTOP) still finds, once
	// resumed, what the dead primary had sent into its socket.
	repl := harness.NewProxy(t, primary.Addr)
	replica := harness.StartRedis(t, harness.WithReplicaOf(repl.Addr()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor(t, 20*time.Second, "the replica in sync", func() bool {
		info, err := replica.Client().Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	px := harness.NewProxy(t, primary.Addr)
	var agents []*Agent
	for i := range 3 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s20a%d", i), Rules: s20Rules,
			Redis: px.Addr(), Coordinators: joinAddrs(coords.GRPC)}))
	}
	const subject = "tenant=hot"
	q := quota("s20", subject)
	on := func(total float64, as ...*Agent) []Target {
		var ts []Target
		for _, a := range as {
			ts = append(ts, Target{Agent: a, Rule: "s20", Subject: subject, Rate: total / float64(len(as))})
		}
		return ts
	}
	cold := StartLoad(on(4.5, agents[0], agents[1]))
	time.Sleep(s20Cold)
	calls := cold.Stop()
	// Let the cold phase's last writes reach the replica, then cut its
	// link: nothing written from now on reaches it.
	time.Sleep(100 * time.Millisecond)
	repl.Blackhole()
	paused := mono()
	hot := StartLoad(on(3*s20Rate, agents[0], agents[1]))
	time.Sleep(s20Leased + time.Duration(r.Int64N(int64(300*time.Millisecond))))
	primary.Kill()
	killed := mono()
	if err := replica.Client().Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		hot.Stop()
		t.Fatalf("chaos: REPLICAOF NO ONE on the replica: %v", err)
	}
	px.Retarget(replica.Addr)
	failedOver := mono()
	moved := StartLoad(on(s20Rate, agents[2]))
	time.Sleep(s20After)
	calls = append(append(calls, moved.Stop()...), hot.Stop()...)
	recs := readRecords(t, agents...)

	allowance := s20Burst + s20Rate*s20Hold.Seconds()
	j := judgeBoth(recs, calls, nil, Spec{Quota: q, Burst: s20Burst, Rate: s20Rate, Bound: allowance, FailClosed: true})
	ok := true
	leasedBefore := admittedIn(recs, q, "", "leased", 0, paused)
	leasedHot := admittedIn(recs, q, "", "leased", paused, killed)
	if leasedBefore > 0 || leasedHot == 0 {
		ok = false
		t.Errorf("admitted on leases: %.0f before the replica's link was cut, %.0f between then and the kill; want 0 and some (promoted on the primary alone)", leasedBefore, leasedHot)
	}
	// The third agent never held a mark: if the new primary had the mark,
	// its first decisions would be answered "leased" and spent on a lease.
	storeAfter := admittedIn(recs, q, agents[2].ID, "store", failedOver, failedOver+s20Hold)
	if storeAfter == 0 {
		ok = false
		t.Errorf("%s admitted nothing on Redis within %v of the failover: the new primary did not decide the subject from its older state (the mark was not lost)", agents[2].ID, s20Hold)
	}
	plain, problems := plainApart(recs, calls, q, s20Burst, s20Rate, killed, failedOver+s20Hold)
	for _, p := range problems {
		ok = false
		t.Errorf("%s: %s", q, p)
	}
	leasedAfter := admittedIn(recs, q, "", "leased", failedOver, math.MaxInt64)
	judgedRow(t, "S20", fmt.Sprintf("mode auto, B = %g, r = %g/s, hold %v: replica's link cut, subject promoted on the primary alone, primary SIGKILLed, replica made primary (REPLICAOF NO ONE, proxy moved): the mark lost", s20Burst, s20Rate, s20Hold),
		fmt.Sprintf("B + r hold = %.0f over B + r T in windows holding the failover (docs/failure-policies.md), 0 in those before the kill and from a hold after the failover", allowance), j, math.NaN(), ok,
		fmt.Sprintf("apart from the failover: overshoot %.2f; admitted on leases: %.0f from the cut to the kill, %.0f after the failover; %s admitted %.0f on Redis within %v of it; failover took %v",
			plain, leasedHot, leasedAfter, agents[2].ID, storeAfter, s20Hold, (failedOver-killed).Round(time.Millisecond)))
}

// plainApart judges quota q by both judges, with no allowance, on what
// was decided entirely before from and entirely after to: windows that do
// not hold the failover are held to the plain bound B + r T. It returns
// the worst overshoot of the four verdicts and their problems.
func plainApart(recs []admission.Record, calls []Call, q string, b, r float64, from, to time.Duration) (float64, []string) {
	var before, after []admission.Record
	for _, rec := range recs {
		switch {
		case rec.Quota != q:
		case rec.At < from:
			before = append(before, rec)
		case rec.At-rec.Latency > to:
			after = append(after, rec)
		}
	}
	var cBefore, cAfter []Call
	for _, c := range calls {
		switch {
		case quota(c.Rule, c.Subj) != q:
		case c.End < from:
			cBefore = append(cBefore, c)
		case c.Start > to:
			cAfter = append(cAfter, c)
		}
	}
	worst := math.Inf(-1)
	var problems []string
	for _, part := range []struct {
		name  string
		recs  []admission.Record
		calls []Call
	}{{"before the kill", before, cBefore}, {"a hold after the failover on", after, cAfter}} {
		for _, v := range []struct {
			judge string
			v     admission.Verdict
		}{
			{"logs", admission.Judge(admission.Check(part.recs, q, b, r), 0)},
			{"clients", admission.Judge(admission.Check(observedRecords(callsObserved(part.calls, q, b, r)), q, b, r), 0)},
		} {
			worst = max(worst, v.v.Certain.Overshoot)
			if !v.v.Pass {
				problems = append(problems, fmt.Sprintf("%s, %s: overshoot %.3f over B + r T (window [%v, %v] after its first admission)",
					part.name, v.judge, v.v.Certain.Overshoot, v.v.Certain.From-v.v.First, v.v.Certain.To-v.v.First))
			}
		}
	}
	return worst, problems
}
