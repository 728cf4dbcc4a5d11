package chaos

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/harness"
)

// leasePeriod is D, the lease term of every leased rule below.
const leasePeriod = time.Second

const leasedRules = `
rules:
  - name: closed
    match: {leased: closed}
    burst: 20
    rate: 100
    mode: leased
    lease: {period: 1s}
  - name: emergency
    match: {leased: emergency}
    burst: 20
    rate: 100
    mode: leased
    lease: {period: 1s}
    on_failure: emergency
    emergency: {burst: 5, rate: 10, max_duration: 30s}
`

// The emergency shape of the rule above.
const emergencyBurst, emergencyRate = 5.0, 10.0

// admittedIn sums the admitted cost of quota q in (from, to], optionally
// of one agent and one path ("" for any).
func admittedIn(recs []admission.Record, q, agent, path string, from, to time.Duration) float64 {
	var sum float64
	for _, r := range recs {
		if r.Allowed && r.Quota == q && r.At > from && r.At <= to &&
			(agent == "" || r.Agent == agent) && (path == "" || r.Path == path) {
			sum += r.Cost
		}
	}
	return sum
}

// S1: the Raft leader is killed three times under load (leased rule, two
// agents). Overshoot 0, and leases keep being granted after each
// election: between D + 200ms and 2s after each kill, when every lease
// granted before the kill has expired, the agents admit on leases again
// (the row shows how much, of the 80 the refill allows).
//
// The coordinators are processes: the leader gets SIGKILL, and is
// restarted on its data dir 2s later.
func TestS1LeaderKilled(t *testing.T) {
	smoke(t)
	r := rng(t)
	coords := StartCoordinatorProcs(t, 3, leasedRules)
	redis := harness.StartRedis(t)
	var agents []*Agent
	for i := range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s1a%d", i), Rules: leasedRules,
			Redis: redis.Addr, Coordinators: joinAddrs(coords.GRPC)}))
	}
	l := StartLoad(loadOn("closed", "x", false, agents...))
	time.Sleep(2 * time.Second)
	var kills []time.Duration
	var elections []time.Duration
	for range 3 {
		time.Sleep(time.Duration(r.Int64N(int64(500 * time.Millisecond))))
		i := coords.Leader(t)
		k := mono()
		coords.Procs[i].Kill()
		coords.Leader(t)
		elections = append(elections, mono()-k)
		kills = append(kills, k)
		time.Sleep(2 * time.Second)
		coords.Procs[i].Start()
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(time.Second)
	l.Stop()
	recs := readRecords(t, agents...)
	q := quota("closed", "x")
	v := judge(recs, q, 0)
	ok := v.Pass
	var after []string
	for j, k := range kills {
		from, to := k+leasePeriod+200*time.Millisecond, k+2*time.Second
		got := admittedIn(recs, q, "", "leased", from, to)
		after = append(after, fmt.Sprintf("%.0f", got))
		if got == 0 {
			ok = false
			t.Errorf("kill %d: no leased admission between D+200ms and 2s after the kill (election took %v): leases not granted after the election",
				j+1, elections[j])
		}
	}
	addRow(t, Row{Scenario: "S1", Fault: "Raft leader SIGKILLed 3 times", Bound: "0; leases granted after each election",
		Overshoot: v.Overshoot, Util: v.Utilisation, Pass: ok,
		Note: fmt.Sprintf("%s; elections %v; admitted in [D+0.2s, 2s] after each kill: %v (of 80 possible)", verdictNote(v), roundAll(elections), after)})
	if !v.Pass {
		t.Errorf("overshoot %.3f (slack %.3f, bound 0), window [%v, %v] after the first admission", v.Overshoot, v.Slack, v.From-v.First, v.To-v.First)
	}
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// S3: one agent is cut from the coordinators (both directions
// blackholed) for 3 lease periods while another keeps its connection and
// takes the reclaimed budget. The cut agent admits nothing on a lease
// after D past the cut (it can only have sent its last renewal before
// the cut, and its validity D_a <= D runs from the send); then the
// fail_closed rule admits nothing more (overshoot 0) and the emergency
// rule stays within b_e + r_e P, P being how long the agent decided by
// policy (measured from its log); after the heal it is granted leases
// again.
//
// One coordinator node, so that no redirect can route the cut agent
// around its proxy (a follower redirects to the leader's advertised
// address).
func TestS3AgentCutOff(t *testing.T) {
	smoke(t)
	r := rng(t)
	coords := harness.StartCoordinators(t, 1, leasedRules)
	redis := harness.StartRedis(t)
	px := NewProxy(t, "coordinator", coords.GRPCAddrs()[0])
	cutAgent := StartAgent(t, AgentOptions{ID: "s3cut", Rules: leasedRules, Redis: redis.Addr, Coordinators: px.Addr()})
	other := StartAgent(t, AgentOptions{ID: "s3other", Rules: leasedRules, Redis: redis.Addr, Coordinators: coords.GRPCAddrs()[0]})
	agents := []*Agent{cutAgent, other}
	// Most of the traffic goes to the agent about to be cut, so it holds
	// most of the quota's rate; at the cut the traffic moves to the other
	// agent (as a gateway fails over), which then asks for everything. A
	// reclaim before the cut agent has stopped would show as overshoot.
	var targets []Target
	for _, rule := range []string{"closed", "emergency"} {
		targets = append(targets,
			Target{Agent: cutAgent, Rule: rule, Subject: "x", Rate: 0.9 * offered},
			Target{Agent: other, Rule: rule, Subject: "x", Rate: 0.1 * offered})
	}
	l := StartLoad(targets)
	time.Sleep(2*time.Second + time.Duration(r.Int64N(int64(500*time.Millisecond))))
	cut := mono()
	px.Blackhole()
	moved := StartLoad([]Target{
		{Agent: other, Rule: "closed", Subject: "x", Rate: 0.9 * offered},
		{Agent: other, Rule: "emergency", Subject: "x", Rate: 0.9 * offered},
	})
	time.Sleep(3 * leasePeriod)
	px.Heal()
	healed := mono()
	time.Sleep(2 * time.Second)
	moved.Stop()
	l.Stop()
	recs := readRecords(t, agents...)

	ok := true
	// No leased admission at the cut agent after its local expiry.
	for _, rule := range []string{"closed", "emergency"} {
		q := quota(rule, "x")
		if n := admittedIn(recs, q, cutAgent.ID, "leased", cut+leasePeriod, healed); n > 0 {
			ok = false
			t.Errorf("%s: the cut agent admitted %.0f on a lease between D after the cut and the heal, want 0", rule, n)
		}
		if n := admittedIn(recs, q, cutAgent.ID, "leased", healed, healed+2*time.Second); n == 0 {
			ok = false
			t.Errorf("%s: the cut agent admitted nothing on a lease after the heal: not granted again", rule)
		}
	}
	// fail_closed: nothing by policy, overshoot 0.
	qc := quota("closed", "x")
	vc := judge(recs, qc, 0)
	fallbackClosed := admittedIn(recs, qc, "", "fallback", 0, math.MaxInt64)
	passC := vc.Pass && fallbackClosed == 0
	addRow(t, Row{Scenario: "S3 fail_closed", Fault: "one agent cut from coordinators for 3D", Bound: "0",
		Overshoot: vc.Overshoot, Util: math.NaN(), Pass: passC && ok,
		Note: fmt.Sprintf("%s; %.0f admitted by policy", verdictNote(vc), fallbackClosed)})
	if !passC {
		t.Errorf("fail_closed: overshoot %.3f (slack %.3f), %.0f admitted by policy; want 0 and 0", vc.Overshoot, vc.Slack, fallbackClosed)
	}
	// emergency: within b_e + r_e P for the one cut agent.
	qe := quota("emergency", "x")
	var first, last time.Duration
	for _, rec := range recs {
		if rec.Quota == qe && rec.Agent == cutAgent.ID && rec.Path == "fallback" && rec.At > cut {
			if first == 0 {
				first = rec.At
			}
			last = rec.At
		}
	}
	p := (last - first).Seconds()
	bound := emergencyBurst + emergencyRate*p
	ve := judge(recs, qe, bound)
	addRow(t, Row{Scenario: "S3 emergency", Fault: "one agent cut from coordinators for 3D",
		Bound:     fmt.Sprintf("N(b_e + r_e P) = %.1f (N=1, P=%.2fs)", bound, p),
		Overshoot: ve.Overshoot, Util: math.NaN(), Pass: ve.Pass && ok, Note: verdictNote(ve)})
	if !ve.Pass {
		t.Errorf("emergency: overshoot %.3f over bound %.3f (slack %.3f), window [%v, %v] after the first admission", ve.Overshoot, bound, ve.Slack, ve.From-ve.First, ve.To-ve.First)
	}
}
