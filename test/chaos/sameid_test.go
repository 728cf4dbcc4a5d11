package chaos

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
)

// S16's shape: one leased, fail_closed rule with the default lease period
// (10s), B = 50 and r = 20/s, offered 3r from 8 callers over 12s; the
// first Raft leader is killed about 4s in.
const (
	s16Burst   = 50.0
	s16Rate    = 20.0
	s16Offered = 3 * s16Rate
	s16Callers = 8
	s16Run     = 12 * time.Second
	s16Kill    = 4 * time.Second
	// s16ID is both agents' -id, as two containers given one hostname
	// (the -id default) would have.
	s16ID = "s16host"
	// s16Util is the utilisation S16 requires of the quota.
	s16Util = 0.8
)

var s16Rules = fmt.Sprintf(`
rules:
  - name: s16
    match: {s16: leased}
    burst: %g
    rate: %g
    mode: leased
    on_failure: fail_closed
`, s16Burst, s16Rate)

// duplicateMetric and duplicateLog are how the coordinator leader reports
// two live agent processes with one id.
const (
	duplicateMetric = "ration_coordinator_duplicate_agent_ids_total"
	duplicateLog    = "two agent processes use the same agent id"
)

// holderName finds the holder name an agent logged at start.
var holderName = regexp.MustCompile(`lease holder started.*?holder"?[=:]"?([^"\s,}]+)`)

// S16: two agent processes with the same -id (two containers with one
// hostname), one leased fail_closed rule, 8 callers split over both
// agents' HTTP /v1/check, the first Raft leader SIGKILLed about 4s in
// (not restarted: two of three nodes serve on). Each process is its own
// holder ("<id>/<incarnation>"), so the two never spend one lease: B + r T
// holds over what the callers were admitted (each admission stamped when
// its answer arrived) and over the agents' logs, utilisation >= 0.8, every
// admission a caller saw is logged, and the live coordinators count the
// duplicate id (ration_coordinator_duplicate_agent_ids_total >= 1 on
// /metrics: the new leader noticed it too).
//
// Protection off (RATION_CHAOS_BREAK=S16): a gRPC proxy in front of each
// coordinator (HolderMerger) rewrites both agents' holder names to one,
// "<id>/merged", as every agent's was before the name carried an
// incarnation: the two processes share its leases and sequence numbers.
// The overshoot checks and the duplicate count must fail.
func TestS16SameAgentID(t *testing.T) {
	scenario(t)
	r := rng(t)
	coords := StartCoordinatorProcs(t, 3, s16Rules)
	redis := harness.StartRedis(t)
	coordAddrs := coords.GRPC
	if broken("S16") {
		t.Log("chaos: S16 protection removed: both agents reach the coordinators as one holder, " + s16ID + "/" + mergedIncarnation)
		coordAddrs = NewHolderMerger(t, coords.GRPC).Addrs
	}
	var agents []*Agent
	for range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: s16ID, Rules: s16Rules,
			Redis: redis.Addr, Coordinators: joinAddrs(coordAddrs)}))
	}
	var names []string
	for _, a := range agents {
		var name string
		waitFor(t, 5*time.Second, "agent holder name in its log", func() bool {
			m := holderName.FindStringSubmatch(a.Log())
			if m != nil {
				name = m[1]
			}
			return m != nil
		})
		names = append(names, name)
	}
	if names[0] == names[1] || !strings.HasPrefix(names[0], s16ID+"/") || !strings.HasPrefix(names[1], s16ID+"/") {
		t.Fatalf("holder names %v: want two names %s/<incarnation>, different", names, s16ID)
	}

	var targets []Target
	for c := range s16Callers {
		targets = append(targets, Target{Agent: agents[c%len(agents)], Rule: "s16", Rate: s16Offered / s16Callers,
			Check: url.Values{"s16": {"leased"}}})
	}
	l := StartLoad(targets)
	start := mono()
	time.Sleep(s16Kill + time.Duration(r.Int64N(int64(500*time.Millisecond))))
	leader := coords.Leader(t)
	kill := mono()
	coords.Procs[leader].Kill()
	coords.Leader(t)
	elected := mono()
	time.Sleep(s16Run - (mono() - start))
	calls := l.Stop()
	span := mono() - start
	recs := readRecords(t, agents...)

	q := quota("s16", "")
	// The bound from the scenario's constants, over the logs and over what
	// the callers saw admitted.
	j := judgeBoth(recs, calls, nil, Spec{Quota: q, Burst: s16Burst, Rate: s16Rate, FailClosed: true})
	bRT := s16Burst + s16Rate*span.Seconds()
	var errs int
	for _, c := range calls {
		if c.Err != nil {
			errs++
		}
	}

	// The duplicate, as the live coordinators count it (the killed leader
	// counted it in a process that is gone; the new one must see it
	// again), and as the logs of all three say it.
	// Polled for up to 5s: not a failure by itself when it runs out.
	var dups float64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		dups = 0
		for i, p := range coords.Procs {
			if p.Exited() {
				continue
			}
			n, _, err := coords.Metric(i, duplicateMetric)
			if err != nil {
				t.Logf("chaos: node%d /metrics: %v", i, err)
				continue
			}
			dups += n
		}
		if dups >= 1 || time.Now().After(deadline) {
			break
		}
	}
	var logLines int
	for _, p := range coords.Procs {
		logLines += strings.Count(p.Log(), duplicateLog)
	}

	ok := j.Util() >= s16Util && j.Client.Admitted > 0 && dups >= 1
	judgedRow(t, "S16", "two agent processes with one -id, HTTP /v1/check, leased fail_closed rule, Raft leader SIGKILLed",
		fmt.Sprintf("0 in the logs and as the callers saw it (B + r T = %.0f over %.1fs), utilisation >= %.1f; duplicate id counted", bRT, span.Seconds(), s16Util),
		j, j.Util(), ok, fmt.Sprintf("holders %s; %d calls, %d errors (503: fail_closed, or cut off at the stop); election %v; %s %.0f on the live nodes, %d log lines",
			strings.Join(names, ", "), len(calls), errs, (elected-kill).Round(time.Millisecond), duplicateMetric, dups, logLines))
	if j.Util() < s16Util {
		t.Errorf("utilisation %.3f, want >= %.1f (admitted %.0f)", j.Util(), s16Util, j.Logs.Admitted)
	}
	if j.Client.Admitted == 0 {
		t.Errorf("the callers received no admission")
	}
	if dups < 1 {
		t.Errorf("%s = %.0f on the live coordinators (%d %q lines in all three logs): the duplicate id went unreported",
			duplicateMetric, dups, logLines, duplicateLog)
	}
}
