package holder_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
)

// noWatch is a real coordinator client without the leader's nudge stream:
// the holder renews at its renew points only, so a small shrink waits
// there to be confirmed, through many full scans of the holder's loop.
type noWatch struct{ holder.Client }

func withoutNudges(c *coordinator.Client) holder.Client { return noWatch{c} }

// drain spends cost-1 decisions of (r, subject) on every holder until
// none of them admits for a while or limit passes, recording admissions.
func drain(t *testing.T, rec *admission.Recorder, r *rules.Rule, subject string, limit time.Duration, hs ...*holder.Leases) int {
	t.Helper()
	n, quiet := 0, 0
	for start := time.Now(); time.Since(start) < limit && quiet < 40; {
		got := 0
		for i, h := range hs {
			for range 2000 {
				res, _, ok := h.Spend(context.Background(), r, subject, 1, h.Now())
				if !ok || !res.Allowed {
					break
				}
				rec.Admit(fmt.Sprint(i), r.Name+"|"+subject, 1)
				got++
			}
		}
		n += got
		if got == 0 {
			quiet++
		} else {
			quiet = 0
		}
		time.Sleep(50 * time.Millisecond)
	}
	return n
}

// checkBound fails t if subject's admissions of r ever exceed
// B + r*(t1-t0) in a window [t0, t1].
func checkBound(t *testing.T, rec *admission.Recorder, r *rules.Rule, subject string) {
	t.Helper()
	q := r.Name + "|" + subject
	rep := admission.Check(rec.Records(), q, r.Burst, r.Rate)
	t.Logf("%s: admitted %v, worst window [%v, %v] overshoot %.3f", q, rep.Admitted, rep.From, rep.To, rep.Overshoot)
	if rep.Overshoot > 1e-6 {
		t.Errorf("%s admitted more than B + r*(t1-t0): overshoot %.3f tokens in [%v, %v]", q, rep.Overshoot, rep.From, rep.To)
	}
}

// A subject that spent part of its copy of the default lease before a
// shrink owes less than the default lease: what it spent is not there to
// give back. Forgetting its copy once it is full at the new, smaller cap
// (idle, in a full scan before the shrink is confirmed) gave the pool the
// default lease's larger surplus at the next renewal or release, tokens
// the subject had already spent, and the subject spent them again through
// the other agent. Its admissions must stay within B + r*T.
func TestDefaultShareShrinkKeepsCopysDebt(t *testing.T) {
	// One agent alone leases max_slice 0.55 of the rate (cap 550); with a
	// second one each gets 0.5 (cap 500): a 9% shrink, under the part
	// that is confirmed at once, and without nudges it is confirmed at
	// the next renew point.
	const yaml = `
rules:
  - name: shrink
    match: {user: "*"}
    burst: 1000
    rate: 1
    mode: leased
    lease: {period: 2s, default_share: 1, max_slice: 0.55}
`
	c := harness.StartCoordinators(t, 1, yaml)
	r := rule(t, yaml, "shrink")
	rec := admission.NewRecorder()
	a1, _ := runHolderVia(t, c, holder.Options{Holder: "a1", IdleAfter: 300 * time.Millisecond}, withoutNudges)
	const spent = 40
	for i := range spent {
		res, fromCopy, ok := spendShared(a1, context.Background(), r, "user=x", 1, a1.Now())
		if !ok || !res.Allowed || !fromCopy {
			t.Fatalf("decision %d: ok %v, allowed %v, from the copy %v; want admitted from the copy", i, ok, res.Allowed, fromCopy)
		}
		rec.Admit("a1", "shrink|user=x", 1)
	}
	a2 := startHolder(t, c, "a2")
	if res, _, ok := a2.Spend(context.Background(), r, "user=y", 1, a2.Now()); !ok || !res.Allowed {
		t.Fatalf("a2's first decision: ok %v, allowed %v", ok, res.Allowed)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if capacity, _, ok := a1.Share(r.Name, rules.DefaultSubject); ok && capacity < 501 {
			t.Logf("a1's default lease shrank to cap %.1f", capacity)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a1's default lease never shrank after a2 arrived")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Idle past IdleAfter, through full scans, the confirming renewal and
	// a release of the default lease once its copies are gone.
	time.Sleep(3 * time.Second)
	n := drain(t, rec, r, "user=x", 8*time.Second, a1, a2)
	t.Logf("after the shrink, user=x was admitted %d more through both agents", n)
	checkBound(t, rec, r, "user=x")
}

// An idle default lease whose copies are not full again is renewed: it
// goes once they do (and after them), never by lapsing, which would lose
// its balance and its copies' with it.
func TestDefaultShareIdleLeaseWithCopiesRenewed(t *testing.T) {
	const yaml = `
rules:
  - name: idle
    match: {user: "*"}
    burst: 100
    rate: 1
    mode: leased
    lease: {period: 1s, default_share: 1}
`
	c := harness.StartCoordinators(t, 1, yaml)
	r := rule(t, yaml, "idle")
	rec := admission.NewRecorder()
	h, _ := runHolder(t, c, holder.Options{Holder: "a", IdleAfter: 200 * time.Millisecond})
	for i := range 50 {
		if res, _, ok := h.Spend(context.Background(), r, "user=x", 1, h.Now()); !ok || !res.Allowed {
			t.Fatalf("decision %d: ok %v, allowed %v", i, ok, res.Allowed)
		}
		rec.Admit("a", "idle|user=x", 1)
	}
	_, leader := c.Leader(t)
	before := listLeases(t, leader.AdminAddr())
	if len(before) != 1 {
		t.Fatalf("coordinator holds %d leases, want the default lease alone", len(before))
	}
	// Three terms idle: the copy refills 1 token a second, far from full.
	time.Sleep(3 * time.Second)
	if _, _, valid := h.Share(r.Name, rules.DefaultSubject); !valid {
		t.Errorf("the idle default lease, whose copy is not full again, is no longer valid: it lapsed instead of being renewed")
	}
	after := listLeases(t, leader.AdminAddr())
	if len(after) != 1 || after[0].LeaseId != before[0].LeaseId {
		t.Errorf("coordinator holds %v after three idle terms, want the same default lease %d renewed", after, before[0].LeaseId)
	}
	drain(t, rec, r, "user=x", 3*time.Second, h)
	checkBound(t, rec, r, "user=x")
}
