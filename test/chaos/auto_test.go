package chaos

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
)

// S18's shape: one mode auto, fail_closed rule, B = 20 and r = 20/s per
// subject, promoted at 30 decisions/s and demoted below 10/s with a 500ms
// hold and 2s leases; three agents on one Redis and a 3-node group. One
// subject flips three times between hot (60/s offered, spread over the
// agents, for 3s) and cold (4.5/s for 4.5s: the rate estimate, time
// constant 1s, takes about 2.5s to fall from 60/s below 10/s, then the
// hold runs out); the Raft leader is killed
// about 1s into the second hot phase, while the promotion is in flight or
// just taken up.
const (
	s18Burst   = 20.0
	s18Rate    = 20.0
	s18Agents  = 3
	s18Cycles  = 3
	s18Hot     = 3 * time.Second
	s18Cold    = 4500 * time.Millisecond
	s18HotUtil = 0.5
)

var s18Rules = fmt.Sprintf(`
rules:
  - name: s18
    match: {tenant: "*"}
    burst: %g
    rate: %g
    mode: auto
    on_failure: fail_closed
    auto: {promote_above: 30, demote_below: 10, hold: 500ms}
    lease: {period: 2s}
`, s18Burst, s18Rate)

// S18: a subject of a mode auto rule promoted to leases and demoted to
// Redis again, three times, through three agents, with the Raft leader
// killed mid-transition. Checked by both judges over the whole run, across
// every hand-over: admissions within B + r T in every window, nothing
// admitted by policy (fail_closed). Every hot phase is decided on leases
// (records on path leased) and every cold phase ends on Redis (records on
// path store in its last second), and the hot phases use at least half of
// what they could (B + r T each).
//
// Break: RATION_CHAOS_BREAK=S18 (splitBrain: agents 1 and 2 lease from
// coordinator groups of their own, so each promotion's budget is leased
// three times over).
func TestS18AutoFlipsHotAndCold(t *testing.T) {
	scenario(t)
	r := rng(t)
	coords := StartCoordinatorProcs(t, 3, s18Rules)
	redis := harness.StartRedis(t)
	var agents []*Agent
	for i := range s18Agents {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s18a%d", i), Rules: s18Rules,
			Redis: redis.Addr, Coordinators: splitBrain(t, "S18", i, s18Rules, joinAddrs(coords.GRPC))}))
	}
	const subject = "tenant=flip"
	targets := func(total float64) []Target {
		var ts []Target
		for _, a := range agents {
			ts = append(ts, Target{Agent: a, Rule: "s18", Subject: subject, Rate: total / s18Agents})
		}
		return ts
	}
	type phase struct {
		hot        bool
		start, end time.Duration
	}
	var phases []phase
	var calls []Call
	var kill, elected time.Duration
	for c := range s18Cycles {
		for _, hot := range []bool{true, false} {
			rate, d := 4.5, s18Cold
			if hot {
				rate, d = 3*s18Rate, s18Hot
			}
			l := StartLoad(targets(rate))
			p := phase{hot: hot, start: mono()}
			if hot && c == 1 {
				time.Sleep(time.Second + time.Duration(r.Int64N(int64(300*time.Millisecond))))
				leader := coords.Leader(t)
				kill = mono()
				coords.Procs[leader].Kill()
				coords.Leader(t)
				elected = mono()
			}
			time.Sleep(d - (mono() - p.start))
			calls = append(calls, l.Stop()...)
			p.end = mono()
			phases = append(phases, p)
		}
	}
	recs := readRecords(t, agents...)

	q := quota("s18", subject)
	j := judgeBoth(recs, calls, nil, Spec{Quota: q, Burst: s18Burst, Rate: s18Rate, FailClosed: true})
	ok := j.Pass()
	if !ok {
		j.Report(t)
	}
	var notes []string
	var hotAdmitted, hotTime float64
	for i, p := range phases {
		var leased, store, admitted int
		for _, rec := range recs {
			if rec.Quota != q || rec.At < p.start || rec.At >= p.end {
				continue
			}
			if rec.Allowed {
				admitted++
			}
			switch {
			case rec.Path == "leased":
				leased++
			case rec.Path == "store" && rec.At >= p.end-time.Second:
				store++
			}
		}
		kind := "cold"
		if p.hot {
			kind = "hot"
			hotAdmitted += float64(admitted)
			hotTime += (p.end - p.start).Seconds()
			if leased == 0 {
				ok = false
				t.Errorf("phase %d (hot): no decision on a lease: the subject was not promoted", i)
			}
		} else if store == 0 {
			ok = false
			t.Errorf("phase %d (cold): no decision on Redis in its last second: the subject was not demoted", i)
		}
		notes = append(notes, fmt.Sprintf("%s %d: %d leased, %d admitted", kind, i, leased, admitted))
	}
	// What the hot phases could admit at most: a full bucket each (the
	// cold phases refill it) and r for their length.
	util := hotAdmitted / (s18Rate*hotTime + s18Cycles*s18Burst)
	if util < s18HotUtil {
		ok = false
		t.Errorf("hot phases: %.0f admitted in %.1fs, utilisation %.3f of B + r T per phase, want >= %.2f", hotAdmitted, hotTime, util, s18HotUtil)
	}
	promotions := 0.0
	for i, a := range agents {
		n, _, err := scrapeMetric(a.HTTP, `ration_agent_hot_promotions_total`)
		if err != nil {
			t.Logf("chaos: agent %d /metrics: %v", i, err)
			continue
		}
		promotions += n
	}
	notes = append(notes, fmt.Sprintf("promotions taken up %.0f; hot utilisation %.2f; election %v; %s",
		promotions, util, (elected-kill).Round(time.Millisecond), j.Note()))
	addRow(t, Row{Scenario: "S18", Fault: "mode auto: one subject hot (3r) and cold (r/4) three times, 3 agents; Raft leader SIGKILLed in the 2nd hot phase",
		Bound:     fmt.Sprintf("0 in the logs and as the callers saw it, across every promotion and demotion; promoted in every hot phase, on Redis at the end of every cold one; hot utilisation >= %.1f", s18HotUtil),
		Overshoot: max(j.Overshoot(), 0), Util: util, Pass: ok, Note: strings.Join(notes, "; ")})
}
