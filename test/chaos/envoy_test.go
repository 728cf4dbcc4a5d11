package chaos

import (
	"fmt"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/harness"
)

// observed is the client's side of a quota: one record per admission it
// received, stamped when the answer arrived, with the call's whole time
// (from its first send) as latency, so the checker's slack covers when
// the charge really happened. The agents' logs can miss nothing the
// client saw, and this history is judged on its own: the bound must hold
// for what gateways actually let through.
type observation struct {
	ID           string
	Start, End   time.Duration // the first send; the admitting answer
	Allowed      bool
	Cost         float64
	Quota        string
	Burst, Rate  float64
	AgentID      string
	AttemptCount int
}

func observedRecords(obs []observation) []admission.Record {
	var recs []admission.Record
	for _, o := range obs {
		// Refusals too: the second judge (admission.Refusals) holds them
		// against the admissions.
		recs = append(recs, admission.Record{At: o.End, Latency: o.End - o.Start, Agent: "client/" + o.AgentID,
			Quota: o.Quota, Cost: o.Cost, Allowed: o.Allowed, Path: "client", RequestID: o.ID, Burst: o.Burst, Rate: o.Rate})
	}
	admission.Sort(recs)
	return recs
}

// callsObserved turns a load's answered calls into observations of quota
// q, whose shape is (b, r).
func callsObserved(calls []Call, q string, b, r float64) []observation {
	obs := make([]observation, 0, len(calls))
	for _, c := range calls {
		if c.Err != nil {
			continue
		}
		obs = append(obs, observation{Start: c.Start, End: c.End, Allowed: c.Allowed, Cost: 1, Quota: q,
			Burst: b, Rate: r, AgentID: c.AgentID, AttemptCount: 1})
	}
	return obs
}

const s14Rules = `
rules:
  - name: s14
    match: {domain: edge, s14: leased}
    burst: 20
    rate: 100
    mode: leased
    lease: {period: 1s}
`

// S14: Envoy's rate-limit service (ShouldRateLimit, through
// go-control-plane's client, as Envoy's filter calls it) on a leased rule,
// two agents, the Raft leader SIGKILLed under load and restarted. The
// bound B + r T holds twice: over the agents' logs (every RLS decision is
// recorded), and over what the clients saw admitted, stamped when each
// answer arrived. Every admission a client saw is in the logs, and leases
// are granted again after the election.
//
// Protection off (RATION_CHAOS_BREAK=S14): the second agent leases from
// its own coordinator group (a split brain); both checks must fail.
func TestS14EnvoyLeaderKilled(t *testing.T) {
	scenario(t)
	r := rng(t)
	coords := StartCoordinatorProcs(t, 3, s14Rules)
	redis := harness.StartRedis(t)
	var agents []*Agent
	for i := range 2 {
		coordAddrs := joinAddrs(coords.GRPC)
		if broken("S14") && i > 0 {
			t.Log("chaos: S14 protection removed: the second agent has its own coordinator")
			coordAddrs = joinAddrs(startCoordinators(t, 1, s14Rules).GRPCAddrs())
		}
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s14a%d", i), Rules: s14Rules,
			Redis: redis.Addr, Coordinators: coordAddrs}))
	}
	var targets []Target
	for _, a := range agents {
		targets = append(targets, Target{Agent: a, Rule: "s14", Rate: offered / float64(len(agents)),
			Envoy: []string{"s14", "leased"}, EnvoyDomain: "edge"})
	}
	l := StartLoad(targets)
	time.Sleep(2*time.Second + time.Duration(r.Int64N(int64(500*time.Millisecond))))
	_, kill, elected := coords.KillLeader(t, 2*time.Second)
	time.Sleep(time.Second)
	calls := l.Stop()
	recs := readRecords(t, agents...)

	q := quota("s14", "")
	j := judgeBoth(recs, calls, nil, Spec{Quota: q, Burst: burst, Rate: rate, FailClosed: true})
	after := admittedIn(recs, q, "", "leased", kill+leasePeriod+200*time.Millisecond, kill+2*time.Second)
	var errs int
	for _, c := range calls {
		if c.Err != nil {
			errs++
		}
	}
	ok := j.Client.Admitted > 0 && after > 0 && j.Util() >= leasedUtil
	judgedRow(t, "S14", "Envoy RLS, leased rule, Raft leader SIGKILLed", fmt.Sprintf("0 in the logs and as the clients saw it; utilisation >= %.1f; leases after the election", leasedUtil),
		j, j.Util(), ok, fmt.Sprintf("%d calls, %d errors (UNAVAILABLE: fail_closed, or cut off at the stop); election %v; admitted in [D+0.2s, 2s] after the kill: %.0f",
			len(calls), errs, (elected-kill).Round(time.Millisecond), after))
	if j.Client.Admitted == 0 {
		t.Errorf("the clients received no admission")
	}
	if j.Util() < leasedUtil {
		t.Errorf("utilisation %.3f, want >= %.1f", j.Util(), leasedUtil)
	}
	if after == 0 {
		t.Errorf("no leased admission between D+200ms and 2s after the kill: leases not granted after the election")
	}
}
