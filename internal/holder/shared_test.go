package holder_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
)

const sharedRules = `
rules:
  - name: shared
    match: {user: "*"}
    burst: 20
    rate: 10
    mode: leased
    lease: {period: 1s, default_share: 0.5}
  - name: many
    match: {user: "*"}
    burst: 1000000
    rate: 1000000
    mode: leased
    lease: {default_share: 0.5}
`

// spendShared is h.Spend, reporting whether the tokens came from the
// subject's copy of the default lease.
func spendShared(h *holder.Leases, ctx context.Context, r *rules.Rule, subject string, cost float64, now int64) (bucket.Result, bool, bool) {
	res, src, ok := h.Spend(ctx, r, subject, cost, now)
	return res, src.Shared(), ok
}

// Three agents hammer the same five subjects of a rule with a default
// share, far above its limit, while the leader is killed: every subject's
// admissions (through the agents' copies of the default lease and through
// its own quota together) stay within B + r*(t1-t0) in every window, both
// parts are spent, and most of the budget is used.
func TestDefaultShareBoundedPerSubject(t *testing.T) {
	c := harness.StartCoordinators(t, 3, sharedRules)
	r := rule(t, sharedRules, "shared")
	rec := admission.NewRecorder()
	const agents, subjects = 3, 5
	hs := make([]*holder.Leases, agents)
	for i := range hs {
		hs[i] = startHolder(t, c, fmt.Sprintf("a%d", i))
	}
	const run = 5 * time.Second
	const offer = 40.0 // per agent and subject, 4x the rule's rate
	var shared, own atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i, h := range hs {
		for s := range subjects {
			wg.Add(1)
			go func() {
				defer wg.Done()
				subject := fmt.Sprintf("user=u%d", s)
				interval := time.Duration(float64(time.Second) / offer)
				for k := 0; time.Since(start) < run && k < int(offer*run.Seconds())+10; k++ {
					if d := time.Until(start.Add(time.Duration(k) * interval)); d > 0 {
						time.Sleep(d)
					}
					res, fromCopy, ok := spendShared(h, context.Background(), r, subject, 1, h.Now())
					if ok && res.Allowed {
						rec.Admit(fmt.Sprint(i), "shared|"+subject, 1)
						if fromCopy {
							shared.Add(1)
						} else {
							own.Add(1)
						}
					}
				}
			}()
		}
	}
	time.Sleep(run / 2)
	li, _ := c.Leader(t)
	c.Kill(li)
	wg.Wait()

	recs := rec.Records()
	for s := range subjects {
		q := fmt.Sprintf("shared|user=u%d", s)
		rep := admission.Check(recs, q, r.Burst, r.Rate)
		t.Logf("%s: admitted %v, utilisation %.2f, worst window [%v, %v] overshoot %.3f",
			q, rep.Admitted, rep.Utilisation, rep.From, rep.To, rep.Overshoot)
		if rep.Overshoot > 1e-6 {
			t.Errorf("%s admitted more than B + r*(t1-t0): overshoot %.3f tokens in [%v, %v]", q, rep.Overshoot, rep.From, rep.To)
		}
		// The leader's loss costs up to a lease period of a part; the
		// rest of the run must use the budget.
		if rep.Utilisation < 0.5 {
			t.Errorf("%s: utilisation %.2f, want >= 0.5", q, rep.Utilisation)
		}
	}
	t.Logf("admitted %d from copies of the default lease, %d from subjects' own leases", shared.Load(), own.Load())
	if shared.Load() == 0 || own.Load() == 0 {
		t.Errorf("admitted %d from copies and %d from own leases: both parts should be spent", shared.Load(), own.Load())
	}
}

// Many fresh subjects of a rule with a default share are admitted from
// their first decision without a request of their own: the coordinator
// holds one lease (the agent's default lease) however many subjects the
// agent decides, and a refund goes back to the copy it came from.
func TestDefaultShareFreshSubjectsNeedNoGrant(t *testing.T) {
	c := harness.StartCoordinators(t, 1, sharedRules)
	r := rule(t, sharedRules, "many")
	h := startHolder(t, c, "a")
	const n = 5000
	for i := range n {
		subject := fmt.Sprintf("user=%d", i)
		res, fromCopy, ok := spendShared(h, context.Background(), r, subject, 1, h.Now())
		if !ok || !res.Allowed || !fromCopy {
			t.Fatalf("decision %d (%s): ok %v, allowed %v, from the copy %v; want an admission from the copy of the default lease", i, subject, ok, res.Allowed, fromCopy)
		}
	}
	_, leader := c.Leader(t)
	leases := listLeases(t, leader.AdminAddr())
	if len(leases) != 1 || leases[0].Quota != "many|"+rules.DefaultSubject {
		var qs []string
		for _, l := range leases {
			qs = append(qs, l.Quota)
		}
		t.Fatalf("coordinator holds leases of %v after %d fresh subjects; want only the default quota %q", qs, n, "many|"+rules.DefaultSubject)
	}

	// A refund restores the copy's balance.
	res1, src, _ := h.Spend(context.Background(), r, "user=refund", 100, h.Now())
	h.Refund(src, 100)
	res2, fromCopy, _ := spendShared(h, context.Background(), r, "user=refund", 100, h.Now())
	if !fromCopy || res2.Remaining < res1.Remaining {
		t.Errorf("after a refund of 100 to the copy, remaining %.0f (from the copy %v); want at least %.0f as before the refund", res2.Remaining, fromCopy, res1.Remaining)
	}
}

// An agent forgets the copies of subjects it no longer decides once they
// are full again, and then the default lease itself: its memory follows
// the subjects in use, not every subject ever seen. A subject decided
// again afterwards starts from a fresh copy and is admitted.
func TestDefaultShareCopiesForgotten(t *testing.T) {
	c := harness.StartCoordinators(t, 1, sharedRules)
	r := rule(t, sharedRules, "many")
	reg := prometheus.NewRegistry()
	h, _ := runHolder(t, c, holder.Options{Holder: "a", IdleAfter: 300 * time.Millisecond, Registry: reg})
	const n = 2000
	for i := range n {
		if res, _, ok := h.Spend(context.Background(), r, fmt.Sprintf("user=%d", i), 1, h.Now()); !ok || !res.Allowed {
			t.Fatalf("decision %d not admitted (ok %v)", i, ok)
		}
	}
	quotas := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "ration_agent_leased_quotas" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no ration_agent_leased_quotas")
		return 0
	}
	if got := quotas(); got != n+1 {
		t.Fatalf("ration_agent_leased_quotas = %v after %d subjects, want %d (theirs and the default quota)", got, n, n+1)
	}
	deadline := time.Now().Add(10 * time.Second)
	for quotas() > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := quotas(); got != 0 {
		t.Fatalf("ration_agent_leased_quotas = %v 10s after the last decision (idle after 300ms), want 0", got)
	}
	if res, fromCopy, ok := spendShared(h, context.Background(), r, "user=7", 1, h.Now()); !ok || !res.Allowed || !fromCopy {
		t.Fatalf("a forgotten subject decided again: ok %v, allowed %v, from a copy %v; want admitted from a fresh copy", ok, res.Allowed, fromCopy)
	}
}

// lease.max_subjects counts the rule's subjects, not its default quota: with
// max_subjects 1, the default quota and one subject's own quota both exist,
// and a second subject still decides from its copy (its own quota refused).
func TestDefaultShareMaxSubjects(t *testing.T) {
	const yaml = `
rules:
  - name: capped
    match: {user: "*"}
    burst: 4
    rate: 0.001
    mode: leased
    lease: {default_share: 0.5, max_subjects: 1}
`
	c := harness.StartCoordinators(t, 1, yaml)
	r := rule(t, yaml, "capped")
	h := startHolder(t, c, "a")
	ctx := context.Background()
	spend := func(subject string) (allowed, fromCopy, ok bool) {
		res, fromCopy, ok := spendShared(h, ctx, r, subject, 1, h.Now())
		return res.Allowed, fromCopy, ok
	}
	// The copy holds 2 (half of burst 4, one agent): the third decision
	// needs u1's own quota.
	for i := range 2 {
		if allowed, fromCopy, ok := spend("user=u1"); !allowed || !fromCopy || !ok {
			t.Fatalf("u1 decision %d: allowed %v, from the copy %v, ok %v; want admitted from the copy", i, allowed, fromCopy, ok)
		}
	}
	if allowed, fromCopy, ok := spend("user=u1"); !allowed || fromCopy || !ok {
		t.Fatalf("u1 decision 3: allowed %v, from the copy %v, ok %v; want admitted from its own quota (the default quota is not one of max_subjects)", allowed, fromCopy, ok)
	}
	for i := range 2 {
		if allowed, fromCopy, ok := spend("user=u2"); !allowed || !fromCopy || !ok {
			t.Fatalf("u2 decision %d: allowed %v, from the copy %v, ok %v; want admitted from the copy", i, allowed, fromCopy, ok)
		}
	}
	// u2's own quota would be the rule's second subject: refused, so a
	// denial from its (valid, dry) copy.
	if allowed, _, ok := spend("user=u2"); allowed || !ok {
		t.Fatalf("u2 decision 3: allowed %v, ok %v; want denied (max_subjects reached, copy dry)", allowed, ok)
	}
}

// A decision of a rule with a default share waits out one cold start in
// all, even when neither the default lease nor the subject's own arrives
// (no coordinator answers): never one for each.
func TestDefaultShareOneColdStart(t *testing.T) {
	// A coordinator that accepts connections and never answers: requests
	// hang until their timeout, longer than the cold start.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	client := coordinator.NewClient([]string{ln.Addr().String()}, coordinator.ClientOptions{CallTimeout: 5 * time.Second, MaxAttempts: 1})
	t.Cleanup(func() { client.Close() })
	const cold = 400 * time.Millisecond
	h, err := holder.New(holder.Options{Client: client, Holder: "a", ColdStart: cold, RequestTimeout: 5 * time.Second, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	r := rule(t, sharedRules, "many")
	start := time.Now()
	_, _, ok := h.Spend(context.Background(), r, "user=new", 1, h.Now())
	took := time.Since(start)
	t.Logf("decision without any coordinator took %v (cold start %v)", took.Round(time.Millisecond), cold)
	if ok {
		t.Fatalf("decided with a lease although no coordinator answers")
	}
	// Waiting for the default lease and then for the subject's own one
	// would take two cold starts (800ms).
	if took > cold+300*time.Millisecond {
		t.Errorf("the decision waited %v, more than one cold start (%v) and slack", took, cold)
	}
}

// A subject's own lease goes back once its copy of the default lease has
// paid for every decision for one term of the copy's lease (the rule's
// lease.period), or for IdleAfter if that is shorter, and comes back (a
// new grant, waited for) when the copy next runs dry. With a period of 1s
// and IdleAfter an hour, it goes back within seconds: an agent restarted
// in a rollout starts its copies nearly empty, and every subject active
// there gets a lease of its own until they refill; kept for IdleAfter
// they stayed at the coordinators (with their renewals) for over a minute.
func TestDefaultShareOwnLeaseGivenBack(t *testing.T) {
	for _, tc := range []struct {
		name, lease string
		idleAfter   time.Duration
	}{
		{"idle after 300ms, period 10s", "{default_share: 0.5}", 300 * time.Millisecond},
		{"idle after an hour, period 1s", "{period: 1s, default_share: 0.5}", time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			yaml := `
rules:
  - name: r
    match: {user: "*"}
    burst: 4
    rate: 4
    mode: leased
    lease: ` + tc.lease + "\n"
			testOwnLeaseGivenBack(t, yaml, tc.idleAfter)
		})
	}
}

func testOwnLeaseGivenBack(t *testing.T, yaml string, idleAfter time.Duration) {
	c := harness.StartCoordinators(t, 1, yaml)
	r := rule(t, yaml, "r")
	reg := prometheus.NewRegistry()
	h, _ := runHolder(t, c, holder.Options{Holder: "a", IdleAfter: idleAfter, Registry: reg})
	ctx := context.Background()
	_, leader := c.Leader(t)
	ownLeases := func() int {
		n := 0
		for _, l := range listLeases(t, leader.AdminAddr()) {
			if l.Quota == "r|user=x" {
				n++
			}
		}
		return n
	}
	released := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "ration_agent_lease_own_released_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		t.Fatal("no ration_agent_lease_own_released_total")
		return 0
	}
	// The copy holds 2 (half of burst 4, one agent): the third decision in
	// a row needs the subject's own lease.
	burst := func(round string) {
		t.Helper()
		var fromOwn int
		for i := range 3 {
			res, fromCopy, ok := spendShared(h, ctx, r, "user=x", 1, h.Now())
			if !ok || !res.Allowed {
				t.Fatalf("%s: decision %d not admitted (ok %v)", round, i, ok)
			}
			if !fromCopy {
				fromOwn++
			}
		}
		if fromOwn == 0 {
			t.Fatalf("%s: three decisions in a row all paid by a copy of 2 tokens", round)
		}
	}
	burst("first burst")
	if n := ownLeases(); n != 1 {
		t.Fatalf("after the first burst the coordinator holds %d own leases of r|user=x, want 1", n)
	}
	// Within the copy (it refills 2/s, from empty) for well past IdleAfter
	// or the lease period, whichever is shorter.
	time.Sleep(time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for released() == 0 && time.Now().Before(deadline) {
		if res, fromCopy, ok := spendShared(h, ctx, r, "user=x", 1, h.Now()); !ok || !res.Allowed || !fromCopy {
			t.Fatalf("a decision within the copy's refill: ok %v, allowed %v, from the copy %v", ok, res.Allowed, fromCopy)
		}
		time.Sleep(600 * time.Millisecond)
	}
	if n := released(); n != 1 {
		t.Fatalf("ration_agent_lease_own_released_total = %v 10s after the copy alone sufficed, want 1", n)
	}
	for range 3 {
		if n := ownLeases(); n != 0 {
			t.Fatalf("the coordinator still holds %d own leases of r|user=x after it was given back", n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second) // the copy is full again
	burst("second burst")
	if n := ownLeases(); n != 1 {
		t.Fatalf("after the second burst the coordinator holds %d own leases of r|user=x, want 1", n)
	}
}
