package holder_test

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
)

const heldRules = `
rules:
  - name: own
    match: {user: "*"}
    burst: 100
    rate: 100
    mode: leased
    lease: {period: 20s}
  - name: shared
    match: {user: "*"}
    burst: 100
    rate: 100
    mode: leased
    lease: {period: 20s, default_share: 1}
`

// heldHolder is a holder on the cluster whose clock (µs) the test moves.
type heldHolder struct {
	*holder.Leases
	clock atomic.Int64
}

func startHeldHolder(t *testing.T, c *harness.Coordinators, id string) *heldHolder {
	t.Helper()
	hh, _ := startHeldHolderVia(t, c, holder.Options{Holder: id}, nil)
	return hh
}

func (hh *heldHolder) advance(d time.Duration) int64 { return hh.clock.Add(d.Microseconds()) }

// lent is what the subject's holding the rule spends has lent.
func (hh *heldHolder) lent(r *rules.Rule, subject string) float64 {
	own, cp := hh.LentOf(r.Name, subject)
	if r.Lease.DefaultShare > 0 {
		return cp
	}
	return own
}

// A held spend (an RLQS take whose tokens Envoy spends later) lends its
// cost out of the lease the plain spend would have spent, the subject's
// own lease or its copy of the rule's default lease: while the hold lasts,
// the balance refills only to the cap less what is lent (so balance and
// lent together never exceed the cap), and only once the hold is over,
// and the loan repaid, does the balance refill behind those tokens. A
// hold longer than the lease may be spent, or than the caller's until, is
// refused and charges nothing.
func TestHeldSpendLendsUntilHoldEnds(t *testing.T) {
	c := harness.StartCoordinators(t, 1, heldRules)
	for _, tc := range []struct{ name, rule string }{
		{"own lease", "own"},
		{"default-share copy", "shared"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rule(t, heldRules, tc.rule)
			hh := startHeldHolder(t, c, "held-"+tc.rule)
			checkHeldSpend(t, hh, r, "user=a")
		})
	}
}

func checkHeldSpend(t *testing.T, hh *heldHolder, r *rules.Rule, subject string) {
	t.Helper()
	ctx := context.Background()
	if _, _, ok := hh.Spend(ctx, r, subject, 1, hh.clock.Load()); !ok {
		t.Fatal("no lease granted")
	}
	sizeOf := subject
	if r.Lease.DefaultShare > 0 {
		sizeOf = rules.DefaultSubject
	}
	capacity, rate, valid := hh.Share(r.Name, sizeOf)
	if !valid || !(capacity > 10) || !(rate > 0) || capacity/rate > 2 {
		t.Fatalf("lease cap %v rate %v valid %v: the test needs a lone holder's whole quota", capacity, rate, valid)
	}
	refill := time.Duration(capacity/rate*1e6+1e5) * time.Microsecond
	now := hh.advance(refill) // full

	// Holds that outlast the lease's validity (20s term), or until.
	h, ok := hh.SpendHeld(ctx, r, subject, 1, now, time.Minute.Microseconds(), math.MaxInt64)
	if !ok || h.Allowed || !h.Short || !(h.Fund > 0) || h.Fund >= time.Minute.Microseconds() {
		t.Fatalf("a hold past the lease's validity: ok %v, %+v; want refused as short, with what the lease could fund", ok, h)
	}
	h, ok = hh.SpendHeld(ctx, r, subject, 1, now, time.Second.Microseconds(), now+500_000)
	if !ok || h.Allowed || !h.Short || h.Fund != 500_000 {
		t.Fatalf("a hold past until: ok %v, %+v; want refused as short, funding 500ms", ok, h)
	}
	if l := hh.lent(r, subject); l != 0 {
		t.Fatalf("refused holds lent %v", l)
	}

	// Lend 60% of the cap for 2s, spend the rest directly.
	held := 0.6 * capacity
	const hold = 2 * time.Second
	t0 := now
	h, ok = hh.SpendHeld(ctx, r, subject, held, t0, hold.Microseconds(), math.MaxInt64)
	if !ok || !h.Allowed || h.Short {
		t.Fatalf("held spend of %v of a full lease of %v: ok %v, %+v", held, capacity, ok, h)
	}
	if l := hh.lent(r, subject); l != held {
		t.Fatalf("lent %v, want %v", l, held)
	}
	if res, _, ok := hh.Spend(ctx, r, subject, capacity-held, t0); !ok || !res.Allowed {
		t.Fatalf("the rest of the balance, %v, was not spendable: %+v", capacity-held, res)
	}

	// Well into the hold, long enough to refill the whole cap: only the
	// cap less what is lent is back.
	now = hh.advance(hold * 3 / 4)
	if res, _, ok := hh.Spend(ctx, r, subject, capacity-held+1, now); !ok || res.Allowed || res.Remaining+held > capacity+1e-9 {
		t.Fatalf("mid-hold: spend of %v gave %+v (ok %v); balance + lent must stay within the cap %v", capacity-held+1, res, ok, capacity)
	}

	// Past the hold: the loan is repaid (by the renewal loop), and the
	// balance refills to the whole cap.
	hh.advance(hold/4 + time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for hh.lent(r, subject) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the loan of %v was not repaid after its hold ended", held)
		}
		time.Sleep(10 * time.Millisecond)
	}
	now = hh.advance(refill)
	if res, _, ok := hh.Spend(ctx, r, subject, capacity, now); !ok || !res.Allowed {
		t.Fatalf("after the hold: the whole cap %v was not spendable: %+v", capacity, res)
	}
}
