package chaos

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
)

// S9: one master of a 3-master Redis Cluster (cluster-require-full-coverage
// no) SIGKILLed under load. Two agents, three quotas: a fail_closed rule's
// subject on a healthy master, the same rule's subject on the dead master,
// and an emergency rule's subject on the dead master (max_duration 1.5s).
// Two variants: without replicas the master is restarted after 4s
// (TestS9ClusterMasterDown); with a replica per master the Cluster
// promotes the dead master's replica after its node timeout and an
// election, 2-4s (TestS9ClusterFailover, rows "S9 failover").
//
// Bounds: the healthy subject's decisions stay on the store path, hold
// B + r T, and keep their latency (the agents' recorded p99 during the
// outage within 1.5x of the worse of before and after it, or 2ms: sub-millisecond figures on a
// shared machine move by more than half from scheduling alone); the dead
// master's decisions follow their policy without waiting once its breaker
// is open (at most s9Waits decisions per agent take the decision timeout);
// the emergency allowance ends at max_duration (no admission by policy
// after it) and stays within N(b_e + r_e max_duration); once the master
// is back or its replica promoted, both agents decide its slots on the
// store path again. The dead subject's bound stays B + r T in the
// failover too: its bucket refills in B/r = 0.2s, less than any outage, so
// writes the replica had not received cost nothing.
//
// Protection off (RATION_CHAOS_BREAK=S9, or S9f for the failover): the
// agents are built with one breaker for the whole store (a code break):
// the dead master opens it, and the healthy master's decisions fall to
// fail_closed too.
func TestS9ClusterMasterDown(t *testing.T) { s9(t, false) }

// TestS9ClusterFailover is S9 with a replica per master: the dead master
// is not restarted, its replica is promoted.
func TestS9ClusterFailover(t *testing.T) { s9(t, true) }

func s9(t *testing.T, failover bool) {
	scenario(t)
	r := rng(t)
	const (
		be, re     = 5.0, 10.0
		maxDur     = 1500 * time.Millisecond
		outage     = 4 * time.Second
		probe      = 500 * time.Millisecond
		decisionTO = 100 * time.Millisecond
	)
	rulesYAML := fmt.Sprintf(`
rules:
  - name: s9
    match: {s9: "*"}
    burst: 20
    rate: 100
    on_failure: fail_closed
  - name: s9-emergency
    match: {s9e: "*"}
    burst: 20
    rate: 100
    on_failure: emergency
    emergency: {burst: %g, rate: %g, max_duration: %v}
`, be, re, maxDur)
	name, brk, opts := "S9", "S9", []harness.RedisOption{harness.WithConfig("cluster-require-full-coverage no")}
	if failover {
		name, brk = "S9 failover", "S9f"
		opts = append(opts, harness.WithClusterReplicas())
	}
	if broken(brk) {
		t.Log("chaos: S9 protection removed: one breaker for the whole store")
	}
	cl := harness.StartCluster(t, opts...)
	healthy, dead, deadE := s9Subject(t, cl, "s9", 0), s9Subject(t, cl, "s9", 1), s9Subject(t, cl, "s9-emergency", 1)
	args := []string{"-decision-timeout", decisionTO.String(), "-breaker-probe-interval", probe.String()}
	var agents []*Agent
	for i := range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s9a%d", i), Rules: rulesYAML,
			Redis: "redis-cluster://" + strings.Join(cl.Addrs, ","), Args: args}))
	}
	var targets []Target
	targets = append(targets, loadOn("s9", healthy, true, agents...)...)
	targets = append(targets, loadOn("s9", dead, true, agents...)...)
	targets = append(targets, loadOn("s9-emergency", deadE, true, agents...)...)
	l := StartLoad(targets)
	time.Sleep(2*time.Second + time.Duration(r.Int64N(int64(500*time.Millisecond))))
	killed := mono()
	cl.Nodes[1].Kill()
	fault, rejoined := "1 of 3 Cluster masters SIGKILLed 4s, N=2", "restart"
	if failover {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		promoted, err := cl.WaitPromoted(ctx, 1)
		cancel()
		if err != nil {
			l.Stop()
			t.Fatal(err)
		}
		fault = fmt.Sprintf("1 of 3 Cluster masters SIGKILLed, its replica %s promoted after %v, N=2", promoted, (mono() - killed).Round(time.Millisecond))
		rejoined = "promotion"
	} else {
		time.Sleep(outage)
		cl.Nodes[1].Restart()
	}
	back := mono()
	// A restarted master answers keyed commands (and its probe) once it
	// has rejoined: its cluster_state turned ok 2-3s after the restart.
	time.Sleep(5 * time.Second)
	calls := l.Stop()
	recs := readRecords(t, agents...)

	s9Healthy(t, name, fault, recs, calls, quota("s9", healthy), killed, back)
	s9Dead(t, name, rejoined, recs, calls, agents, quota("s9", dead), quota("s9-emergency", deadE), killed, back, decisionTO)

	// The emergency allowance ends at max_duration.
	qe := quota("s9-emergency", deadE)
	eb := float64(len(agents)) * (be + re*maxDur.Seconds())
	je := judgeBoth(recs, calls, nil, Spec{Quota: qe, Burst: burst, Rate: rate, Bound: eb})
	late := admittedIn(recs, qe, "", "fallback", killed+maxDur+decisionTO*4, back)
	ok := late == 0
	if !ok {
		t.Errorf("%.0f admitted by the emergency policy more than max_duration %v after the kill", late, maxDur)
	}
	judgedRow(t, name+" emergency", "the killed master's emergency subject",
		fmt.Sprintf("N(b_e + r_e max_duration) = %.0f; none by policy after max_duration", eb), je, je.Util(), ok,
		fmt.Sprintf("admitted by policy after max_duration: %.0f", late))
}

// s9Healthy judges the healthy master's subject qh over the outage
// (killed, back): decided by Redis, bound held, latency kept.
func s9Healthy(t *testing.T, name, fault string, recs []admission.Record, calls []Call, qh string, killed, back time.Duration) {
	t.Helper()
	jh := judgeBoth(recs, calls, nil, Spec{Quota: qh, Burst: burst, Rate: rate, Bound: 0, FailClosed: true})
	// The reference is the healthy state on both sides of the outage:
	// the worse p99 of before the kill and of after the recovery. On a
	// shared two-core machine one window's p99 moves by more than half
	// with what else runs; a slowdown the dead master causes is in the
	// outage only.
	before := max(p99(recs, qh, 0, killed), p99(recs, qh, back+2*time.Second, math.MaxInt64))
	during := p99(recs, qh, killed, back)
	latBound := max(before*3/2, 2*time.Millisecond)
	// Judged over the outage; decisions outside it (a timeout at the
	// restart, when the machine is busiest) are reported.
	var policy, policyOutside int
	for _, rec := range recs {
		switch {
		case rec.Quota != qh || rec.Path == "store" || rec.Path == "cached":
		case rec.At > killed && rec.At < back:
			if policy < 3 {
				t.Logf("healthy subject decided by %s: %+v (master killed at %v)", rec.Path, rec, killed)
			}
			policy++
		default:
			policyOutside++
		}
	}
	ok := policy == 0 && during <= latBound && jh.Util() >= s9Util
	if policy > 0 {
		t.Errorf("%d decisions of the healthy master's subject during the outage were not decided by Redis", policy)
	}
	if during > latBound {
		t.Errorf("healthy master's p99 %v during the outage, want <= %v (1.5x %v before and after, or 2ms)", during, latBound, before)
	}
	if jh.Util() < s9Util {
		t.Errorf("healthy master: utilisation %.3f, want >= %.2f", jh.Util(), s9Util)
	}
	judgedRow(t, name+" healthy", fault,
		fmt.Sprintf("B + rT; every decision of the outage by Redis; p99 <= max(1.5x before and after, 2ms); utilisation >= %.2f", s9Util), jh, jh.Util(), ok,
		fmt.Sprintf("%d decided by policy during the outage (%d outside it); p99 %v before and after, %v during", policy, policyOutside, before.Round(10*time.Microsecond), during.Round(10*time.Microsecond)))
}

// s9Dead judges the dead master's subjects: their policy at once once the
// breaker is open, and the store path again within s9Rejoin of back (the
// restart or the promotion).
func s9Dead(t *testing.T, name, rejoined string, recs []admission.Record, calls []Call, agents []*Agent, qd, qe string, killed, back, decisionTO time.Duration) {
	t.Helper()
	waits := map[string]int{}
	for _, rec := range recs {
		if (rec.Quota == qd || rec.Quota == qe) && rec.At > killed && rec.At < back && rec.Latency >= decisionTO {
			waits[rec.Agent]++
		}
	}
	jd := judgeBoth(recs, calls, nil, Spec{Quota: qd, Burst: burst, Rate: rate, Bound: 0, FailClosed: true})
	ok := true
	var resumed []string
	for _, a := range agents {
		if waits[a.ID] > s9Waits {
			ok = false
			t.Errorf("agent %s: %d decisions on the dead master's slots waited the decision timeout, want <= %d", a.ID, waits[a.ID], s9Waits)
		}
		got := admittedIn(recs, qd, a.ID, "store", back, back+s9Rejoin)
		resumed = append(resumed, fmt.Sprintf("%s %.0f", a.ID, got))
		if got == 0 {
			ok = false
			t.Errorf("agent %s admitted nothing on the store path for the dead master's subject within %v of the %s", a.ID, s9Rejoin, rejoined)
		}
	}
	judgedRow(t, name+" dead", "the killed master's fail_closed subject",
		fmt.Sprintf("0; <= %d decisions per agent wait the timeout; store path again within %v of the %s", s9Waits, s9Rejoin, rejoined), jd, jd.Util(), ok,
		fmt.Sprintf("waited the timeout: %v; admitted on the store path after the %s: %s", waits, rejoined, strings.Join(resumed, ", ")))
}

// s9Rejoin is how soon after its restart the killed master's slots must
// be decided by Redis again: its rejoining (2-3s measured) and a probe.
const s9Rejoin = 4500 * time.Millisecond

// s9Util is the healthy subject's utilisation floor: unaffected by the
// outage, as S0's.
const s9Util = 0.8

// s9Waits is how many decisions on the dead master's slots one agent may
// make wait the decision timeout: the breaker's threshold (3). A killed
// master's connections break and its port refuses new ones, so the
// decisions in flight at the kill fail at once, not at their timeout (they
// did wait it out, 12-14 per agent, while go-redis retried each dial
// after 100ms). The timeout is 100ms, not the 50ms of S10: on a loaded
// two-core machine the healthy master's decisions took up to 150ms now
// and then, and three such in a row open its breaker, which is not what
// S9 tests.
const s9Waits = 3

// s9Subject finds a subject of rule whose bucket lives on master i.
func s9Subject(t *testing.T, cl *harness.Cluster, rule string, i int) string {
	t.Helper()
	return cl.SubjectOn(t, i, "x", func(s string) int { return bucket.KeySlot(bucket.Key(rule, s)) })
}

// p99 is the 99th percentile of the agents' recorded latency of q's
// decisions made in (from, to).
func p99(recs []admission.Record, q string, from, to time.Duration) time.Duration {
	var l []time.Duration
	for _, r := range recs {
		if r.Quota == q && r.At > from && r.At < to {
			l = append(l, r.Latency)
		}
	}
	if len(l) == 0 {
		return 0
	}
	slices.Sort(l)
	return l[int(math.Ceil(0.99*float64(len(l))))-1]
}
