package chaos

import (
	"fmt"
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
// both). Every agent is granted leases again after quorum is back.
//
// Break: RATION_CHAOS_BREAK=S5 gives the agents looser policies than the
// scenario's (s5LooseRules); the judges hold them to its constants.
func TestS5NoQuorum(t *testing.T) {
	scenario(t)
	r := rng(t)
	coords := startCoordinators(t, 3, leasedRules)
	redis := harness.StartRedis(t)
	agentRules := leasedRules
	if broken("S5") {
		// The agents decide by looser policies than the scenario states
		// (fail_open for the fail_closed rule, ten times the emergency
		// shape); the judges hold them to the scenario's constants.
		t.Log("chaos: S5 protection removed: the agents' rules are fail_open and emergency {burst: 50, rate: 100}")
		agentRules = s5LooseRules
	}
	var agents []*Agent
	for i := range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s5a%d", i), Rules: agentRules,
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
	// An agent decides by policy until its next renewal gets through: up
	// to the holder's request timeout (2s) and backoff (1s) after quorum
	// is back; 4s covers it.
	time.Sleep(4 * time.Second)
	calls := l.Stop()
	recs := readRecords(t, agents...)

	// Recovery: every agent is granted leases again after quorum is back.
	recovered := func(q string) (bool, string) {
		ok := true
		var got []string
		for _, a := range agents {
			n := admittedIn(recs, q, a.ID, "leased", back, back+4*time.Second)
			got = append(got, fmt.Sprintf("%s %.0f", a.ID, n))
			if n == 0 {
				ok = false
				t.Errorf("%s: agent %s admitted nothing on a lease within 4s of quorum being back", q, a.ID)
			}
		}
		return ok, "leased admissions within 4s of quorum back: " + strings.Join(got, ", ")
	}
	qc := quota("closed", "x")
	jc := judgeBoth(recs, calls, nil, Spec{Quota: qc, Burst: burst, Rate: rate, FailClosed: true})
	okC, noteC := recovered(qc)
	if jc.Util() < s5Util {
		okC = false
		t.Errorf("fail_closed: utilisation %.3f, want >= %.2f", jc.Util(), s5Util)
	}
	judgedRow(t, "S5 fail_closed", "no quorum for 5s", fmt.Sprintf("0; utilisation >= %.2f; leases again after quorum is back", s5Util), jc, jc.Util(), okC,
		fmt.Sprintf("quorum back after %v; %s", (back-lost).Round(time.Millisecond), noteC))
	qe := quota("emergency", "x")
	var bound float64
	var ps []string
	for _, a := range agents {
		p := fallbackSpan(recs, qe, a.ID, lost).Seconds()
		bound += emergencyBurst + emergencyRate*p
		ps = append(ps, fmt.Sprintf("%.2fs", p))
	}
	stated := float64(len(agents)) * (emergencyBurst + emergencyRate*5)
	je := judgeBoth(recs, calls, nil, Spec{Quota: qe, Burst: burst, Rate: rate, Bound: bound})
	okE, noteE := recovered(qe)
	if je.Util() < s5Util {
		okE = false
		t.Errorf("emergency: utilisation %.3f, want >= %.2f", je.Util(), s5Util)
	}
	judgedRow(t, "S5 emergency", "no quorum for 5s",
		fmt.Sprintf("N(b_e + r_e x 5s) = %.0f; with measured P %s: %.1f; utilisation >= %.2f; leases again after quorum is back", stated, strings.Join(ps, ", "), bound, s5Util),
		je, je.Util(), okE, noteE)
}

// s5Util is S5's utilisation floor: of about 12s of load, leases serve
// about 2s before the loss and 1-4s after quorum is back, and about 1s
// of the outage on leases still valid; the policy admits little or
// nothing in between.
const s5Util = 0.4

// s5LooseRules is leasedRules with the policies S5's break gives the
// agents.
const s5LooseRules = `
rules:
  - name: closed
    match: {leased: closed}
    burst: 20
    rate: 100
    mode: leased
    lease: {period: 1s}
    on_failure: fail_open
  - name: emergency
    match: {leased: emergency}
    burst: 20
    rate: 100
    mode: leased
    lease: {period: 1s}
    on_failure: emergency
    emergency: {burst: 50, rate: 100, max_duration: 30s}
`

// S6: an agent is paused (SIGSTOP) for 2.5 lease periods, past its lease
// expiry, while another agent keeps asking for the whole quota and is
// granted what the coordinator reclaims; then it is resumed (SIGCONT).
// CLOCK_MONOTONIC runs on while a process is stopped, so on resuming the
// agent finds its lease expired and must not admit on it: overshoot 0.
// (The admission log carries no lease id yet, so the check is the
// overshoot itself: an admission on the stale lease spends tokens the
// other agent was granted.) The resumed agent is granted leases again.
//
// Break: RATION_CHAOS_BREAK=S6 (splitBrain).
func TestS6AgentPaused(t *testing.T) {
	scenario(t)
	r := rng(t)
	coords := startCoordinators(t, 3, leasedRules)
	redis := harness.StartRedis(t)
	var agents []*Agent
	for i := range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s6a%d", i), Rules: leasedRules,
			Redis: redis.Addr, Coordinators: splitBrain(t, "S6", i, leasedRules, joinAddrs(coords.GRPCAddrs()))}))
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
	calls := l.Stop()
	recs := readRecords(t, agents...)
	q := quota("closed", "x")
	j := judgeBoth(recs, calls, nil, Spec{Quota: q, Burst: burst, Rate: rate, FailClosed: true})
	early := admittedIn(recs, q, paused.ID, "leased", resumed, resumed+100*time.Millisecond)
	other := admittedIn(recs, q, agents[1].ID, "leased", stop+leasePeriod+500*time.Millisecond, resumed)
	again := admittedIn(recs, q, paused.ID, "leased", resumed, resumed+3*time.Second)
	ok := j.Util() >= leasedUtil && again > 0
	judgedRow(t, "S6", "agent SIGSTOPped for 2.5D, resumed", fmt.Sprintf("0; utilisation >= %.1f; the resumed agent is granted leases again", leasedUtil), j, j.Util(), ok,
		fmt.Sprintf("paused agent admitted %.0f on a lease in its first 100ms back, %.0f in 3s; the other took %.0f while it was stopped", early, again, other))
	if j.Util() < leasedUtil {
		t.Errorf("utilisation %.3f, want >= %.1f", j.Util(), leasedUtil)
	}
	if again == 0 {
		t.Errorf("the resumed agent admitted nothing on a lease in the 3s after SIGCONT: not granted again")
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
//
// Break: RATION_CHAOS_BREAK=S4 (splitBrain; the second agent's own group
// is not behind the dropper).
func TestS4LeaseRepliesDropped(t *testing.T) {
	scenario(t)
	r := rng(t)
	coords := startCoordinators(t, 1, leasedRules)
	redis := harness.StartRedis(t)
	d := NewReplyDropper(t, coords.GRPCAddrs()[0], 0.3, r)
	var agents []*Agent
	for i := range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s4a%d", i), Rules: leasedRules,
			Redis: redis.Addr, Coordinators: splitBrain(t, "S4", i, leasedRules, d.Addr())}))
	}
	l := StartLoad(loadOn("closed", "x", false, agents...))
	time.Sleep(10 * time.Second)
	calls := l.Stop()
	recs := readRecords(t, agents...)
	q := quota("closed", "x")
	j := judgeBoth(recs, calls, nil, Spec{Quota: q, Burst: burst, Rate: rate, FailClosed: true})
	d.mu.Lock()
	st := d.Stats
	d.mu.Unlock()
	ok := len(st.Mismatched) == 0 && st.Retried > 0 && st.Streams > 0 && j.Util() >= leasedUtil
	judgedRow(t, "S4", "30% of lease replies dropped after apply, retried", fmt.Sprintf("0; every retry answered from the record; utilisation >= %.1f", leasedUtil),
		j, j.Util(), ok, fmt.Sprintf("%d calls (on %d RenewStreams), %d replies dropped, %d retries checked, %d answered differently", st.Calls, st.Streams, st.Dropped, st.Retried, len(st.Mismatched)))
	for _, m := range st.Mismatched {
		t.Errorf("retry not answered from the record: %s", m)
	}
	if st.Retried == 0 {
		t.Errorf("no dropped request was retried (%d calls, %d dropped)", st.Calls, st.Dropped)
	}
	if st.Streams == 0 {
		t.Errorf("no RenewStream went through the dropper: the agents' way of renewing was not the one tested")
	}
	if j.Util() < leasedUtil {
		t.Errorf("utilisation %.3f, want >= %.1f", j.Util(), leasedUtil)
	}
}

// S1 with SIGSTOP: the leader process is paused for 2s (past the
// election timeout), three times, then resumed. While it sleeps the
// others elect a leader, which should go on granting (docs/leases.md: a
// leader cut off costs about one election timeout plus one commit); on
// waking, the old leader cannot commit in a term that is over. Overshoot
// 0, and leases granted while the old leader is stopped.
//
// It failed before the fix in docs/reliability.md ("Bugs found"): the
// agents' coordinator client stuck to the silent leader for the whole
// renewal. Break: RATION_CHAOS_BREAK=S1pause (splitBrain).
func TestS1LeaderPaused(t *testing.T) {
	scenario(t)
	r := rng(t)
	coords := StartCoordinatorProcs(t, 3, leasedRules)
	redis := harness.StartRedis(t)
	var agents []*Agent
	for i := range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s1pa%d", i), Rules: leasedRules,
			Redis: redis.Addr, Coordinators: splitBrain(t, "S1pause", i, leasedRules, joinAddrs(coords.GRPC))}))
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
		// 3s of steady load after each pause: each costs about D plus an
		// election of admissions (1.1s of 3 in one make test run on two
		// shared cores, where elections took up to 1.5s), so the
		// utilisation floor is held over a run of about 20s, not 14s.
		time.Sleep(3 * time.Second)
	}
	time.Sleep(2 * time.Second)
	calls := l.Stop()
	recs := readRecords(t, agents...)
	q := quota("closed", "x")
	j := judgeBoth(recs, calls, nil, Spec{Quota: q, Burst: burst, Rate: rate, FailClosed: true})
	ok := j.Util() >= leasedUtil
	if !ok {
		t.Errorf("utilisation %.3f, want >= %.1f", j.Util(), leasedUtil)
	}
	var after, gaps []string
	for n, p := range pauses {
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
			t.Errorf("pause %d: no leased admission between D+200ms and 2s after the leader was stopped (first one %s after the stop; resumed at 2s)", n+1, gap)
		}
	}
	judgedRow(t, "S1 pause", "Raft leader SIGSTOPped 2s, 3 times", fmt.Sprintf("0; leases granted during each pause; utilisation >= %.1f", leasedUtil), j, j.Util(), ok,
		fmt.Sprintf("admitted in [D+0.2s, 2s] after each stop: %v (of 80 possible); first leased admission after the old leases expired: %v after the stop", after, gaps))
}
