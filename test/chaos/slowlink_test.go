package chaos

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// S19's shape: one leased, fail_closed rule over every user, all of it
// the default share (lease.default_share 1), B = 1000 and r = 1/s per
// subject, leases of 10s; one coordinator. Agent a1 spends s19Spent of
// one subject, then its link to the coordinator turns slow (s19Delay each
// way, the proxy's Delay) and the subject stays idle on a1 past the
// agents' idle time (one minute, holder.Options.IdleAfter: the scenario
// cannot be shorter; the lease period does not shorten it); then agent a2
// arrives, offering the subject s19Offer, and a1's default lease shrinks
// below what a1's copy of the subject holds, to make room for it; after
// s19Arrive the subject is offered to a1 as well, for s19Drain.
const (
	s19Burst  = 1000.0
	s19Rate   = 1.0
	s19Spent  = 560
	s19Delay  = 150 * time.Millisecond
	s19Idle   = 61 * time.Second
	s19Offer  = 300.0
	s19Arrive = 3 * time.Second
	s19Drain  = 4 * time.Second
	// s19Util: the subject's budget is used (measured 1.000), so a run
	// that admits little after the arrival does not pass unseen.
	s19Util = 0.9
)

var s19Rules = fmt.Sprintf(`
rules:
  - name: s19
    match: {user: "*"}
    burst: %g
    rate: %g
    mode: leased
    on_failure: fail_closed
    lease: {period: 10s, default_share: 1}
`, s19Burst, s19Rate)

// S19: a copy of the default lease after a shrink, on a slow link. a1's
// copy of the subject had spent below the shrunken cap, so it owes less
// than the default lease; it must be kept (and counted in what a renewal
// gives back) until that debt is settled, or the pool gets back tokens the
// subject already spent and the subject spends them again through both
// agents. Per subject, in the logs and as the callers saw it: admissions
// within B + r T in every window, nothing admitted by policy; the
// subject uses at least 0.9 of B + r T.
//
// The slow link is what lets the copy go before its debt is settled: with
// s19Delay 0 the break below admitted 1066 (within the bound) instead of
// 1565.
//
// Break: RATION_CHAOS_BREAK=S19 builds the agents with a copy forgotten
// once it is full again at the new cap, whatever it owes (codeBreaks).
func TestS19DefaultShareSlowLinkArrival(t *testing.T) {
	scenario(t)
	_ = rng(t)
	coords := StartCoordinatorProcs(t, 1, s19Rules)
	redis := harness.StartRedis(t)
	px := harness.NewProxy(t, coords.GRPC[0])
	a1 := StartAgent(t, AgentOptions{ID: "s19a1", Rules: s19Rules, Redis: redis.Addr, Coordinators: px.Addr()})
	const x = "user=x"

	calls := callsOf(t, a1, "s19", x, s19Spent)
	spent := mono()
	px.Delay(harness.Upstream, s19Delay, 0)
	px.Delay(harness.Downstream, s19Delay, 0)
	time.Sleep(s19Idle - (mono() - spent))
	// a2 arrives: it starts only now, since an agent takes its share of
	// every default-share lease before it is ready (a1's shrinks then).
	a2 := StartAgent(t, AgentOptions{ID: "s19a2", Rules: s19Rules, Redis: redis.Addr, Coordinators: coords.GRPC[0]})
	arrive := StartLoad([]Target{{Agent: a2, Rule: "s19", Subject: x, Rate: s19Offer}})
	time.Sleep(s19Arrive)
	both := StartLoad([]Target{{Agent: a1, Rule: "s19", Subject: x, Rate: s19Offer}})
	time.Sleep(s19Drain)
	calls = append(append(calls, both.Stop()...), arrive.Stop()...)
	recs := readRecords(t, a1, a2)

	first := 0
	for _, c := range calls[:s19Spent] {
		if c.Err == nil && c.Allowed {
			first++
		}
	}
	returned, _, err := scrapeMetric(a1.HTTP, "ration_agent_lease_tokens_returned_total")
	if err != nil {
		t.Logf("chaos: a1 /metrics: %v", err)
	}
	j := judgeBoth(recs, calls, nil, Spec{Quota: quota("s19", x), Burst: s19Burst, Rate: s19Rate, FailClosed: true})
	ok := j.Util() >= s19Util
	if !ok {
		t.Errorf("%s: utilisation %.3f, want >= %.1f (admitted %.0f)", quota("s19", x), j.Util(), s19Util, j.Logs.Admitted)
	}
	if first < s19Spent*9/10 {
		ok = false
		t.Errorf("a1 admitted %d of its first %d decisions of %s, want nearly all (the scenario needs them spent before the shrink)", first, s19Spent, x)
	}
	after := func(a *Agent) float64 { return admittedIn(recs, quota("s19", x), a.ID, "", spent, math.MaxInt64) }
	judgedRow(t, "S19", fmt.Sprintf("lease.default_share 1, B = %g, r = %g/s: a1 spends %d of a subject, its link to the coordinator slowed %v each way, the subject idle %v, a2 arrives with it (a1's default lease shrinks), then a1 too", s19Burst, s19Rate, s19Spent, s19Delay, s19Idle.Round(time.Second)),
		fmt.Sprintf("0 per subject in the logs and as the callers saw it; utilisation >= %.1f", s19Util), j, j.Util(), ok,
		fmt.Sprintf("a1 admitted %d of its first %d; after them a1 admitted %.0f, a2 %.0f; a1 gave back %.0f tokens in all", first, s19Spent, after(a1), after(a2), returned))
}

// callsOf makes n calls of (rule, subject) to a, one after another, as
// Calls for the judges.
func callsOf(t testing.TB, a *Agent, rule, subject string, n int) []Call {
	t.Helper()
	out := make([]Call, 0, n)
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c := Call{Start: mono(), AgentID: a.ID, Rule: rule, Subj: subject}
		resp, err := a.Client.Allow(ctx, &rationv1.AllowRequest{Rule: rule, Subject: subject})
		c.End = mono()
		cancel()
		if err != nil {
			c.Err = err
		} else {
			c.Allowed, c.Reason = resp.Allowed, resp.Reason
		}
		out = append(out, c)
	}
	return out
}
