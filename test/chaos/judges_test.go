package chaos

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
)

// Two judges look at every quota of a scenario, and the scenario fails
// when either does:
//
// The logs: the agents' -record logs, replayed through admission.Check
// with the quota's shape taken from the scenario's constants (never from
// what the agents wrote), judged on the certain overshoot: each charge
// placed anywhere in [At - Latency, At], each window widened only by its
// own admissions' latencies.
//
// The clients: what the load generator saw, on its own. A call is sent at
// Start and answered at End (both CLOCK_MONOTONIC, read by the test); an
// admission it received was decided somewhere in [Start, End]. Counting
// it at End alone (its receive time, the latest moment it can have been
// decided) is not conservative: answers held up together and delivered
// in a bunch would look like an overshoot that never happened, and the
// old cure, a slack of rate x the run's slowest call on every window,
// lets one slow call excuse every other window. So each admission is
// counted at its receive time and each window reaches back to the
// earliest send of the admissions it counts (admission.CertainOvershoot):
// a window [t0, t1] of receive times is allowed B + r (t1 - t0) plus, as
// slack, r x (t0 - the earliest send in it), at most r x that one call's
// own latency. The clients count only the admissions they received, a
// lower bound of what was charged in each window (an admission whose
// answer was lost is not counted), so what they prove is a lower bound
// of the true overshoot: if it breaks the bound, the system did.
//
// And the two are held against each other (crossCheck): every admission
// a client received is in some agent's log (a decision answered but not
// recorded fails here, whatever the log's own verdict), and every charge
// in the logs is either an admission a client received or can be put on
// a call whose answer was lost (an error, a timeout, or cut off when the
// load stopped), each such call explaining at most one charge.

// Spec is a quota as the scenario states it: its shape from the
// scenario's constants and the overshoot its failure model allows.
type Spec struct {
	Quota       string
	Burst, Rate float64
	Bound       float64
	// FailClosed: the rule's policy is fail_closed, so nothing may be
	// admitted by policy (path fallback).
	FailClosed bool
	// RecordBurst and RecordRate, when set, are the shape the agents are
	// expected to write in their records instead of (Burst, Rate): an
	// agent records a scope: global Redis rule's global shape, not the
	// region's share it enforces (the soak's global-split).
	RecordBurst, RecordRate float64
	// Settle, when set, judges false refusals in steady state: none is
	// allowed after the first Settle of the run (first grants, the
	// lease split between agents) outside every Unsteady window (each
	// fault, from when it starts to Settle after it ends). Within them
	// false refusals are counted and printed, not held to a number.
	Settle   time.Duration
	Unsteady []Window
	// SteadyUnheld, when set, says why the steady-state count is printed
	// but held to nothing.
	SteadyUnheld string
	// SteadyAllowed is the share of the quota's refusals that may be
	// false in steady state (0: none).
	SteadyAllowed float64
}

// Window is a span on the clock of the records and the calls
// (CLOCK_MONOTONIC).
type Window struct{ From, To time.Duration }

// Judged is both judges' verdict on one quota, and the cross-check.
type Judged struct {
	Spec
	Logs   admission.Verdict // the agents' records
	Client admission.Verdict // what the clients received
	// Missing: admissions a client received that no log holds.
	// Unexplained: charges in the logs that no client received and no
	// lost call can account for. Lost: calls without an answer.
	Missing, Unexplained, Lost int
	// SteadyFalse: false refusals in steady state (Spec.Settle), by the
	// logs' judge and the clients'.
	SteadyFalse, SteadyFalseClient int
	// ShapeWrong: records of the quota with another burst or rate than
	// the scenario's.
	ShapeWrong int
	// ByPolicy is the cost admitted by failure policy (path fallback).
	ByPolicy float64
	// RunUtil is the logs' admitted cost over B + r T, T the span of the
	// clients' calls to the quota (first send to last answer): unlike
	// the checker's utilisation (over the span of the admissions), an
	// outage at the end of the run, or a run that admits nothing after a
	// fault, counts against it.
	RunUtil  float64
	Problems []string
}

// Pass is whether both judges and the cross-check passed.
func (j Judged) Pass() bool { return len(j.Problems) == 0 }

// Overshoot is the larger of the two judges' certain overshoots.
func (j Judged) Overshoot() float64 {
	return max(j.Logs.Certain.Overshoot, j.Client.Certain.Overshoot)
}

// Util is the utilisation the floors are held to: RunUtil.
func (j Judged) Util() float64 { return j.RunUtil }

// Note is the row's account of both judges.
func (j Judged) Note() string {
	s := fmt.Sprintf("logs: admitted %.0f, overshoot %.2f with each admission's latency as its slack (%.2f at the stamps; a run-wide slack would allow %.2f); clients: admitted %.0f, overshoot %.2f (%.2f at the receive times), utilisation %.3f; cross-check: %d received but not logged, %d logged charges unexplained (%d calls lost)",
		j.Logs.Admitted, j.Logs.Certain.Overshoot, j.Logs.Overshoot, j.Logs.Slack,
		j.Client.Admitted, j.Client.Certain.Overshoot, j.Client.Overshoot, j.Client.Utilisation, j.Missing, j.Unexplained, j.Lost)
	if j.FailClosed {
		s += fmt.Sprintf("; %.0f admitted by policy (fail_closed)", j.ByPolicy)
	}
	// The second judge: refusals the budget held (admission.Refusals),
	// printed, not yet held to per-scenario allowances.
	s += fmt.Sprintf("; false refusals: logs %d of %d refused, clients %d of %d",
		j.Logs.Refusals.False, j.Logs.Refusals.Refused, j.Client.Refusals.False, j.Client.Refusals.Refused)
	switch {
	case j.Settle > 0 && j.SteadyUnheld != "":
		s += fmt.Sprintf(" (in steady state: logs %d, clients %d; not held: %s)", j.SteadyFalse, j.SteadyFalseClient, j.SteadyUnheld)
	case j.Settle > 0:
		s += fmt.Sprintf(" (in steady state: logs %d, clients %d; allowed %g of the refusals)", j.SteadyFalse, j.SteadyFalseClient, j.SteadyAllowed)
	}
	return s
}

// Report fails t with every problem found.
func (j Judged) Report(t testing.TB) {
	t.Helper()
	for _, p := range j.Problems {
		t.Errorf("%s: %s", j.Quota, p)
	}
}

// judgeBoth runs both judges and the cross-check on quota s.Quota: recs
// are the merged logs, calls every call the clients made to it (others
// are skipped), obs what the clients saw admitted, as the client judge
// counts it (nil: one observation per answered call; S11 and S15 count a
// request retried under one id once, from its first send).
func judgeBoth(recs []admission.Record, calls []Call, obs []observation, s Spec) Judged {
	j := Judged{Spec: s}
	var mine []Call
	for _, c := range calls {
		if quota(c.Rule, c.Subj) == s.Quota {
			mine = append(mine, c)
		}
	}
	if obs == nil {
		obs = callsObserved(mine, s.Quota, s.Burst, s.Rate)
	}
	j.Logs = admission.Judge(admission.Check(recs, s.Quota, s.Burst, s.Rate), s.Bound)
	j.Client = admission.Judge(admission.Check(observedRecords(obs), s.Quota, s.Burst, s.Rate), s.Bound)
	wantB, wantR := s.Burst, s.Rate
	if s.RecordBurst != 0 || s.RecordRate != 0 {
		wantB, wantR = s.RecordBurst, s.RecordRate
	}
	for _, r := range recs {
		if r.Quota == s.Quota && (r.Burst != wantB || r.Rate != wantR) {
			j.ShapeWrong++
		}
	}
	j.Missing, j.Unexplained, j.Lost = crossCheck(recs, mine, s.Quota)
	j.ByPolicy = byPolicy(recs, s.Quota)
	if len(mine) > 0 {
		from, to := mine[0].Start, mine[0].End
		for _, c := range mine {
			from, to = min(from, c.Start), max(to, c.End)
		}
		if allowed := s.Burst + s.Rate*(to-from).Seconds(); allowed > 0 {
			j.RunUtil = j.Logs.Admitted / allowed
		}
	}
	bad := func(format string, args ...any) { j.Problems = append(j.Problems, fmt.Sprintf(format, args...)) }
	if s.Settle > 0 && len(mine) > 0 {
		j.SteadyFalse = steady(j.Logs.Refusals.At, mine, s)
		j.SteadyFalseClient = steady(j.Client.Refusals.At, mine, s)
		allowed := int(s.SteadyAllowed * float64(j.Logs.Refusals.Refused))
		if s.SteadyUnheld == "" && (j.SteadyFalse > allowed || j.SteadyFalseClient > allowed) {
			bad("false refusals in steady state (past the first %v, outside every fault and the %v after it): logs %d, clients %d; want at most %d (%g of %d refused: callers within their budget refused)",
				s.Settle, s.Settle, j.SteadyFalse, j.SteadyFalseClient, allowed, s.SteadyAllowed, j.Logs.Refusals.Refused)
		}
	}
	if !j.Logs.Pass {
		bad("logs: overshoot %.3f over the bound %.3f, wherever in its [At - latency, At] each charge happened (window [%v, %v] after the first admission; %.3f at the recorded times)",
			j.Logs.Certain.Overshoot, s.Bound, j.Logs.Certain.From-j.Logs.First, j.Logs.Certain.To-j.Logs.First, j.Logs.Overshoot)
	}
	if !j.Client.Pass {
		bad("clients: overshoot %.3f over the bound %.3f in what they received, wherever between send and answer each was decided (window [%v, %v] after the first admission; %.3f at the receive times)",
			j.Client.Certain.Overshoot, s.Bound, j.Client.Certain.From-j.Client.First, j.Client.Certain.To-j.Client.First, j.Client.Overshoot)
	}
	if j.Missing > 0 {
		bad("%d admissions a client received are in no agent's log", j.Missing)
	}
	if j.Unexplained > 0 {
		bad("%d charges in the logs were received by no client and match no lost call (%d calls lost)", j.Unexplained, j.Lost)
	}
	if s.FailClosed && j.ByPolicy > 0 {
		bad("%.0f admitted by policy under fail_closed, want 0", j.ByPolicy)
	}
	if j.ShapeWrong > 0 {
		bad("%d decisions recorded with a shape other than B = %g, r = %g", j.ShapeWrong, wantB, wantR)
	}
	return j
}

// steady counts the false refusals known at ats that fall in steady
// state: past the first s.Settle of the quota's calls, outside every
// window of s.Unsteady widened by s.Settle at its end, and before the
// last call was sent (the load's end cuts calls off).
func steady(ats []time.Duration, calls []Call, s Spec) int {
	first, last := calls[0].Start, calls[0].Start
	for _, c := range calls {
		first, last = min(first, c.Start), max(last, c.Start)
	}
	n := 0
next:
	for _, at := range ats {
		if at < first+s.Settle || at > last {
			continue
		}
		for _, w := range s.Unsteady {
			if at >= w.From && at <= w.To+s.Settle {
				continue next
			}
		}
		n++
	}
	return n
}

// crossCheck matches the clients' view of quota q with the logs.
//
// Every admitted answer is matched to a distinct admitted log line of the
// same agent and quota: by request id when the call had one, otherwise by
// time (the line's At lies in the call's [Start, End]: the agent stamps a
// decision before it answers, on the clock the client reads). Matching
// calls in order of their End to the earliest free line at or after
// their Start finds a full matching whenever one exists.
//
// Every charge (an admitted line that is not a replay) left over must be
// a call the client lost: an error or a cut-off call of the same agent
// and quota, sent before the charge (its answer may have been decided at
// any time after it was sent). Each lost call explains one charge;
// matching charges in time order to the earliest-sent free lost call is
// again optimal.
func crossCheck(recs []admission.Record, calls []Call, q string) (missing, unexplained, lost int) {
	lines := map[string][]int{} // agent -> indexes into recs, time order
	byID := map[string][]int{}
	for i, r := range recs {
		if r.Quota != q || !r.Allowed {
			continue
		}
		lines[r.Agent] = append(lines[r.Agent], i)
		if r.RequestID != "" {
			byID[r.RequestID] = append(byID[r.RequestID], i)
		}
	}
	used := make([]bool, len(recs))
	var byTime, lostCalls []Call
	for _, c := range calls {
		switch {
		case c.Err != nil:
			lostCalls = append(lostCalls, c)
		case !c.Allowed:
		case c.RequestID != "":
			found := false
			for _, i := range byID[c.RequestID] {
				if !used[i] && recs[i].Agent == c.AgentID {
					used[i], found = true, true
					break
				}
			}
			if !found {
				missing++
			}
		default:
			byTime = append(byTime, c)
		}
	}
	slices.SortFunc(byTime, func(a, b Call) int { return cmpDur(a.End, b.End) })
	for _, c := range byTime {
		ls := lines[c.AgentID]
		k, _ := slices.BinarySearchFunc(ls, c.Start, func(i int, t time.Duration) int { return cmpDur(recs[i].At, t) })
		found := false
		for ; k < len(ls) && recs[ls[k]].At <= c.End; k++ {
			if !used[ls[k]] {
				used[ls[k]], found = true, true
				break
			}
		}
		if !found {
			missing++
		}
	}
	lost = len(lostCalls)
	slices.SortFunc(lostCalls, func(a, b Call) int { return cmpDur(a.Start, b.Start) })
	free := map[string][]Call{}
	for _, c := range lostCalls {
		free[c.AgentID] = append(free[c.AgentID], c)
	}
	next := map[string]int{}
	for agent, ls := range lines {
		for _, i := range ls {
			if used[i] || recs[i].Path == "replay" {
				continue
			}
			f, n := free[agent], next[agent]
			if n < len(f) && f[n].Start <= recs[i].At {
				next[agent]++
				continue
			}
			unexplained++
		}
	}
	return missing, unexplained, lost
}

func cmpDur(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// byPolicy is the cost of quota q the agents admitted by failure policy
// (path fallback): 0 wherever the policy is fail_closed.
func byPolicy(recs []admission.Record, q string) float64 {
	return admittedIn(recs, q, "", "fallback", 0, 1<<62)
}

// judgedRow adds the row of one quota judged by both judges: it passes
// when both judges and the cross-check pass and ok (the scenario's own
// checks) holds; extra is the scenario's part of the note.
func judgedRow(t testing.TB, scenario, fault, bound string, j Judged, util float64, ok bool, extra string) {
	t.Helper()
	note := j.Note()
	if extra != "" {
		note += "; " + extra
	}
	addRow(t, Row{Scenario: scenario, Fault: fault, Bound: bound, Overshoot: j.Overshoot(), Util: util,
		Pass: ok && j.Pass(), Note: note})
	j.Report(t)
}
