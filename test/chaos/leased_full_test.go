package chaos

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/harness"
)

// fallbackSpan is how long agent decided quota q by policy after t0: from
// its first fallback decision after t0 to its last (0 when none).
func fallbackSpan(recs []admission.Record, q, agent string, t0 time.Duration) time.Duration {
	var first, last time.Duration
	for _, r := range recs {
		if r.Quota == q && r.Agent == agent && r.Path == "fallback" && r.At > t0 {
			if first == 0 {
				first = r.At
			}
			last = r.At
		}
	}
	return last - first
}

// S5: no coordinator quorum for 5s (two of three nodes killed, then
// restarted) under load from two agents. Leases run out at D_a, then each
// rule's policy decides until a leader serves again: fail_closed admits
// nothing more (overshoot 0); emergency stays within
// sum over agents of (b_e + r_e P_i), P_i being how long agent i decided
// by policy (measured; the stated bound takes P = 5s, and the row shows
// both).
func TestS5NoQuorum(t *testing.T) {
	fullOnly(t)
	r := rng(t)
	coords := harness.StartCoordinators(t, 3, leasedRules)
	redis := harness.StartRedis(t)
	var agents []*Agent
	for i := range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s5a%d", i), Rules: leasedRules,
			Redis: redis.Addr, Coordinators: joinAddrs(coords.GRPCAddrs())}))
	}
	l := StartLoad(append(loadOn("closed", "x", false, agents...), loadOn("emergency", "x", false, agents...)...))
	time.Sleep(2*time.Second + time.Duration(r.Int64N(int64(500*time.Millisecond))))
	leader, _ := coords.Leader(t)
	victims := []int{leader, (leader + 1 + r.IntN(2)) % 3}
	lost := mono()
	for _, i := range victims {
		coords.Kill(i)
	}
	time.Sleep(5 * time.Second)
	for _, i := range victims {
		coords.Restart(i)
	}
	coords.Leader(t)
	back := mono()
	time.Sleep(3 * time.Second)
	l.Stop()
	recs := readRecords(t, agents...)

	qc := quota("closed", "x")
	vc := judge(recs, qc, 0)
	byPolicy := admittedIn(recs, qc, "", "fallback", 0, math.MaxInt64)
	passC := vc.Pass && byPolicy == 0
	addRow(t, Row{Scenario: "S5 fail_closed", Fault: "no quorum for 5s", Bound: "0", Overshoot: vc.Overshoot, Util: math.NaN(), Pass: passC,
		Note: fmt.Sprintf("%s; %.0f admitted by policy; quorum back after %v", verdictNote(vc), byPolicy, (back - lost).Round(time.Millisecond))})
	if !passC {
		t.Errorf("fail_closed: overshoot %.3f (slack %.3f), %.0f admitted by policy; want 0 and 0", vc.Overshoot, vc.Slack, byPolicy)
	}
	qe := quota("emergency", "x")
	var bound float64
	var ps []string
	for _, a := range agents {
		p := fallbackSpan(recs, qe, a.ID, lost).Seconds()
		bound += emergencyBurst + emergencyRate*p
		ps = append(ps, fmt.Sprintf("%.2fs", p))
	}
	stated := float64(len(agents)) * (emergencyBurst + emergencyRate*5)
	ve := judge(recs, qe, bound)
	addRow(t, Row{Scenario: "S5 emergency", Fault: "no quorum for 5s",
		Bound:     fmt.Sprintf("N(b_e + r_e x 5s) = %.0f; with measured P %s: %.1f", stated, strings.Join(ps, ", "), bound),
		Overshoot: ve.Overshoot, Util: math.NaN(), Pass: ve.Pass, Note: verdictNote(ve)})
	if !ve.Pass {
		t.Errorf("emergency: overshoot %.3f over bound %.3f (slack %.3f), window [%v, %v] after the first admission", ve.Overshoot, bound, ve.Slack, ve.From-ve.First, ve.To-ve.First)
	}
}

// S6: an agent is paused (SIGSTOP) for 2.5 lease periods, past its lease
// expiry, while another agent keeps asking for the whole quota and is
// granted what the coordinator reclaims; then it is resumed (SIGCONT).
// CLOCK_MONOTONIC runs on while a process is stopped, so on resuming the
// agent finds its lease expired and must not admit on it: overshoot 0.
// (The admission log carries no lease id yet, so the check is the
// overshoot itself: an admission on the stale lease spends tokens the
// other agent was granted.)
func TestS6AgentPaused(t *testing.T) {
	fullOnly(t)
	r := rng(t)
	coords := harness.StartCoordinators(t, 3, leasedRules)
	redis := harness.StartRedis(t)
	var agents []*Agent
	for i := range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s6a%d", i), Rules: leasedRules,
			Redis: redis.Addr, Coordinators: joinAddrs(coords.GRPCAddrs())}))
	}
	l := StartLoad(loadOn("closed", "x", false, agents...))
	time.Sleep(2*time.Second + time.Duration(r.Int64N(int64(500*time.Millisecond))))
	paused := agents[0]
	stop := mono()
	paused.Pause()
	time.Sleep(5 * leasePeriod / 2)
	paused.Resume()
	resumed := mono()
	time.Sleep(3 * time.Second)
	l.Stop()
	recs := readRecords(t, agents...)
	q := quota("closed", "x")
	v := judge(recs, q, 0)
	early := admittedIn(recs, q, paused.ID, "leased", resumed, resumed+100*time.Millisecond)
	other := admittedIn(recs, q, agents[1].ID, "leased", stop+leasePeriod+500*time.Millisecond, resumed)
	addRow(t, Row{Scenario: "S6", Fault: "agent SIGSTOPped for 2.5D, resumed", Bound: "0", Overshoot: v.Overshoot, Util: v.Utilisation, Pass: v.Pass,
		Note: fmt.Sprintf("%s; paused agent admitted %.0f on a lease in its first 100ms back; the other took %.0f while it was stopped", verdictNote(v), early, other)})
	if !v.Pass {
		t.Errorf("overshoot %.3f (slack %.3f, bound 0), window [%v, %v] after the first admission", v.Overshoot, v.Slack, v.From-v.First, v.To-v.First)
	}
}

// S4: 30% of lease replies are dropped after the coordinator applied the
// request (a gRPC proxy forwards, then answers UNAVAILABLE), and the
// agents retry with the same sequence number. Every retry of a dropped
// request must get the recorded answer (applied once: no second grant,
// no second credit of a return), and the overshoot stays 0 (a return
// credited twice would let the pool hand out tokens twice).
//
// One coordinator node, so no redirect routes an agent around the proxy.
func TestS4LeaseRepliesDropped(t *testing.T) {
	fullOnly(t)
	r := rng(t)
	coords := harness.StartCoordinators(t, 1, leasedRules)
	redis := harness.StartRedis(t)
	d := NewReplyDropper(t, coords.GRPCAddrs()[0], 0.3, r)
	var agents []*Agent
	for i := range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s4a%d", i), Rules: leasedRules,
			Redis: redis.Addr, Coordinators: d.Addr()}))
	}
	l := StartLoad(loadOn("closed", "x", false, agents...))
	time.Sleep(10 * time.Second)
	l.Stop()
	recs := readRecords(t, agents...)
	q := quota("closed", "x")
	v := judge(recs, q, 0)
	d.mu.Lock()
	st := d.Stats
	d.mu.Unlock()
	ok := v.Pass && len(st.Mismatched) == 0 && st.Retried > 0
	addRow(t, Row{Scenario: "S4", Fault: "30% of lease replies dropped after apply, retried", Bound: "0; every retry answered from the record",
		Overshoot: v.Overshoot, Util: v.Utilisation, Pass: ok,
		Note: fmt.Sprintf("%s; %d calls, %d replies dropped, %d retries checked, %d answered differently", verdictNote(v), st.Calls, st.Dropped, st.Retried, len(st.Mismatched))})
	if !v.Pass {
		t.Errorf("overshoot %.3f (slack %.3f, bound 0), window [%v, %v] after the first admission", v.Overshoot, v.Slack, v.From-v.First, v.To-v.First)
	}
	for _, m := range st.Mismatched {
		t.Errorf("retry not answered from the record: %s", m)
	}
	if st.Retried == 0 {
		t.Errorf("no dropped request was retried (%d calls, %d dropped)", st.Calls, st.Dropped)
	}
}

// S1 with SIGSTOP: the leader process is paused for 2s (past the
// election timeout), three times, then resumed. While it sleeps the
// others elect a leader, which should go on granting (docs/leases.md: a
// leader cut off costs about one election timeout plus one commit); on
// waking, the old leader cannot commit in a term that is over. Overshoot
// 0, and leases granted while the old leader is stopped.
//
// FAILS today (reported): the agents' coordinator client sticks to the
// last leader and gives each attempt the whole call timeout (2s, the
// holder's request timeout too), so against a silent leader no renewal
// reaches the new one until the old one wakes; the 1s leases lapse and
// fail_closed denies with a healthy majority up.
func TestS1LeaderPaused(t *testing.T) {
	fullOnly(t)
	r := rng(t)
	coords := StartCoordinatorProcs(t, 3, leasedRules)
	redis := harness.StartRedis(t)
	var agents []*Agent
	for i := range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s1pa%d", i), Rules: leasedRules,
			Redis: redis.Addr, Coordinators: joinAddrs(coords.GRPC)}))
	}
	l := StartLoad(loadOn("closed", "x", false, agents...))
	time.Sleep(2 * time.Second)
	var pauses []time.Duration
	for range 3 {
		time.Sleep(time.Duration(r.Int64N(int64(500 * time.Millisecond))))
		i := coords.Leader(t)
		p := mono()
		coords.Procs[i].Pause()
		time.Sleep(2 * time.Second)
		coords.Procs[i].Resume()
		pauses = append(pauses, p)
		time.Sleep(1500 * time.Millisecond)
	}
	time.Sleep(time.Second)
	l.Stop()
	recs := readRecords(t, agents...)
	q := quota("closed", "x")
	v := judge(recs, q, 0)
	ok := v.Pass
	var after, gaps []string
	for j, p := range pauses {
		got := admittedIn(recs, q, "", "leased", p+leasePeriod+200*time.Millisecond, p+2*time.Second)
		after = append(after, fmt.Sprintf("%.0f", got))
		// The first leased admission once every lease from before the
		// stop has expired: when a lease granted after it was first used.
		gap := "none"
		for _, rec := range recs {
			if rec.Allowed && rec.Quota == q && rec.Path == "leased" && rec.At > p+leasePeriod+200*time.Millisecond {
				gap = (rec.At - p).Round(time.Millisecond).String()
				break
			}
		}
		gaps = append(gaps, gap)
		if got == 0 {
			ok = false
			t.Errorf("pause %d: no leased admission between D+200ms and 2s after the leader was stopped (first one %s after the stop; resumed at 2s)", j+1, gap)
		}
	}
	addRow(t, Row{Scenario: "S1 pause", Fault: "Raft leader SIGSTOPped 2s, 3 times", Bound: "0; leases granted during each pause",
		Overshoot: v.Overshoot, Util: v.Utilisation, Pass: ok,
		Note: fmt.Sprintf("%s; admitted in [D+0.2s, 2s] after each stop: %v (of 80 possible); first leased admission after the old leases expired: %v after the stop", verdictNote(v), after, gaps)})
	if !v.Pass {
		t.Errorf("overshoot %.3f (slack %.3f, bound 0), window [%v, %v] after the first admission", v.Overshoot, v.Slack, v.From-v.First, v.To-v.First)
	}
}
