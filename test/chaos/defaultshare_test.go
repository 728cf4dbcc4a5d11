package chaos

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
)

// S17's shape: one leased, fail_closed rule over many subjects with
// lease.default_share 0.5 and the default lease period (10s), B = 20 and
// r = 10/s per subject; three agents; two hot subjects offered 3r each and
// ten light ones offered r/4 each (within what the agents' copies of the
// default lease refill), spread over every agent, for 12s; the first Raft
// leader is killed about 4s in.
const (
	s17Burst   = 20.0
	s17Rate    = 10.0
	s17Run     = 12 * time.Second
	s17Kill    = 4 * time.Second
	s17Hot     = 2
	s17Light   = 10
	s17Agents  = 3
	s17HotUtil = 0.7
	// s17LightAdmitted is the share of the light subjects' answered calls
	// that must be admitted: each stays within its copies, whatever the
	// leader.
	s17LightAdmitted = 0.95
)

var s17Rules = fmt.Sprintf(`
rules:
  - name: s17
    match: {tenant: "*"}
    burst: %g
    rate: %g
    mode: leased
    on_failure: fail_closed
    lease: {default_share: 0.5}
`, s17Burst, s17Rate)

// S17: lease.default_share under a leader kill. Every subject's budget is
// half a quota of its own and half the rule's default quota, of which each
// agent spends a copy per subject. Per subject, in the logs and as the
// callers saw it: admissions within B + r T, nothing admitted by policy
// (fail_closed); the hot subjects use at least 70% of their budget (both
// halves); the light subjects are admitted (>= 95% of their calls) from
// their copies alone, so the coordinators never hold a quota of their own
// for them (ration_coordinator_quotas{rule="s17"} is at most the default
// quota plus the hot subjects').
//
// Break: RATION_CHAOS_BREAK=S17 (splitBrain).
func TestS17DefaultShareLeaderKilled(t *testing.T) {
	scenario(t)
	r := rng(t)
	coords := StartCoordinatorProcs(t, 3, s17Rules)
	redis := harness.StartRedis(t)
	var agents []*Agent
	for i := range s17Agents {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s17a%d", i), Rules: s17Rules,
			Redis: redis.Addr, Coordinators: splitBrain(t, "S17", i, s17Rules, joinAddrs(coords.GRPC))}))
	}
	subject := func(hot bool, k int) string {
		if hot {
			return fmt.Sprintf("tenant=hot%d", k)
		}
		return fmt.Sprintf("tenant=light%d", k)
	}
	var targets []Target
	for _, a := range agents {
		for k := range s17Hot {
			targets = append(targets, Target{Agent: a, Rule: "s17", Subject: subject(true, k), Rate: 3 * s17Rate / s17Agents})
		}
		for k := range s17Light {
			targets = append(targets, Target{Agent: a, Rule: "s17", Subject: subject(false, k), Rate: s17Rate / 4 / s17Agents})
		}
	}
	l := StartLoad(targets)
	start := mono()
	time.Sleep(s17Kill + time.Duration(r.Int64N(int64(500*time.Millisecond))))
	leader := coords.Leader(t)
	kill := mono()
	coords.Procs[leader].Kill()
	coords.Leader(t)
	elected := mono()
	time.Sleep(s17Run - (mono() - start))
	calls := l.Stop()
	recs := readRecords(t, agents...)

	ok := true
	var notes []string
	worst := -s17Burst
	for k := range s17Hot {
		q := quota("s17", subject(true, k))
		j := judgeBoth(recs, calls, nil, Spec{Quota: q, Burst: s17Burst, Rate: s17Rate, FailClosed: true})
		if !j.Pass() {
			ok = false
			j.Report(t)
		}
		if j.Util() < s17HotUtil {
			ok = false
			t.Errorf("%s: utilisation %.3f, want >= %.2f (admitted %.0f)", q, j.Util(), s17HotUtil, j.Logs.Admitted)
		}
		worst = max(worst, j.Overshoot())
		notes = append(notes, fmt.Sprintf("%s: logs overshoot %.2f, callers %.2f, utilisation %.2f", q, j.Logs.Certain.Overshoot, j.Client.Certain.Overshoot, j.Util()))
	}
	var lightCalls, lightAdmitted int
	for k := range s17Light {
		q := quota("s17", subject(false, k))
		j := judgeBoth(recs, calls, nil, Spec{Quota: q, Burst: s17Burst, Rate: s17Rate, FailClosed: true})
		if !j.Pass() {
			ok = false
			j.Report(t)
		}
		worst = max(worst, j.Overshoot())
		for _, c := range calls {
			// A call cut off when the load stopped has no answer to judge.
			if c.Rule == "s17" && c.Subj == subject(false, k) && !errors.Is(c.Err, errStopped) {
				lightCalls++
				if c.Err == nil && c.Allowed {
					lightAdmitted++
				}
			}
		}
	}
	lightShare := float64(lightAdmitted) / float64(max(lightCalls, 1))
	if lightShare < s17LightAdmitted {
		ok = false
		t.Errorf("light subjects: %d of %d calls admitted (%.3f), want >= %.2f", lightAdmitted, lightCalls, lightShare, s17LightAdmitted)
	}
	var quotas float64
	for i, p := range coords.Procs {
		if p.Exited() {
			continue
		}
		n, _, err := coords.Metric(i, `ration_coordinator_quotas{rule="s17"}`)
		if err != nil {
			t.Logf("chaos: node%d /metrics: %v", i, err)
			continue
		}
		quotas = max(quotas, n)
	}
	if maxQuotas := float64(1 + s17Hot); quotas > maxQuotas {
		ok = false
		t.Errorf("the coordinators hold %.0f quotas of rule s17, want at most %.0f (the default quota and the hot subjects'): light subjects asked for quotas of their own", quotas, maxQuotas)
	}
	notes = append(notes, fmt.Sprintf("light: %d/%d calls admitted; coordinator quotas %.0f; election %v", lightAdmitted, lightCalls, quotas, (elected-kill).Round(time.Millisecond)))
	addRow(t, Row{Scenario: "S17", Fault: "lease.default_share 0.5, 3 agents, 2 hot + 10 light subjects, Raft leader SIGKILLed",
		Bound:     fmt.Sprintf("0 per subject in the logs and as the callers saw it; hot utilisation >= %.1f; light admitted >= %.2f with no quota of their own", s17HotUtil, s17LightAdmitted),
		Overshoot: max(worst, 0), Util: math.NaN(), Pass: ok, Note: strings.Join(notes, "; ")})
}
