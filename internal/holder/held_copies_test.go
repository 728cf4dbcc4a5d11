package holder_test

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// The tests here hold a subject's copy of a rule's default lease to what
// its held spends have lent: the copy, and the default lease it mirrors,
// must keep the loan counted against the coordinator's reservation until
// the hold is over, through eviction, release and a shrink.

// renewLog is a holder's real coordinator client that keeps the answers
// to its Renew calls, for a test to know a renewal was answered. It has
// no nudge stream (it is no holder.Watcher): the holder renews when its
// clock, which the test moves, says so.
type renewLog struct {
	holder.Client
	mu      sync.Mutex
	answers []*rationv1.RenewResponse
}

func (rl *renewLog) wrap(c *coordinator.Client) holder.Client {
	rl.Client = c
	return rl
}

func (rl *renewLog) Renew(ctx context.Context, req *rationv1.RenewRequest) (*rationv1.RenewResponse, error) {
	resp, err := rl.Client.Renew(ctx, req)
	if err == nil {
		rl.mu.Lock()
		rl.answers = append(rl.answers, resp)
		rl.mu.Unlock()
	}
	return resp, err
}

func (rl *renewLog) count() int {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	return len(rl.answers)
}

// waitDefault waits for an answer, the from'th or later, that grants the
// default quota as ok says, and returns its index and that grant.
func (rl *renewLog) waitDefault(t *testing.T, from int, ok func(*rationv1.Grant) bool) (int, *rationv1.Grant) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rl.mu.Lock()
		for i := from; i < len(rl.answers); i++ {
			for _, g := range rl.answers[i].GetGrants() {
				if g.GetQuota().GetSubject() == rules.DefaultSubject && g.GetError() == "" && ok(g) {
					rl.mu.Unlock()
					return i, g
				}
			}
		}
		rl.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no renewal answer from the %dth on granted the default quota as expected", from)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func anyGrant(*rationv1.Grant) bool { return true }

// startHeldHolderVia is startHeldHolder with options o and the client via
// makes (nil: the real one); stop releases its leases and waits for it.
func startHeldHolderVia(t *testing.T, c *harness.Coordinators, o holder.Options, via func(*coordinator.Client) holder.Client) (hh *heldHolder, stop func()) {
	t.Helper()
	hh = &heldHolder{}
	hh.clock.Store(1)
	o.Clock = hh.clock.Load
	hh.Leases, stop = runHolderVia(t, c, o, via)
	return hh, stop
}

// fillCopy gets subject's copy of r's default lease granted and full, and
// returns its cap and the time it takes to refill (the test needs a lone
// holder's whole quota, refilled within 2s).
func fillCopy(t *testing.T, hh *heldHolder, r *rules.Rule, subject string) (capacity float64, refill time.Duration) {
	t.Helper()
	if _, _, ok := hh.Spend(context.Background(), r, subject, 1, hh.clock.Load()); !ok {
		t.Fatal("no lease granted")
	}
	capacity, rate, valid := hh.Share(r.Name, rules.DefaultSubject)
	if !valid || capacity != r.Burst || !(rate > 0) || capacity/rate > 2 {
		t.Fatalf("default lease cap %v rate %v valid %v: the test needs a lone holder's whole quota", capacity, rate, valid)
	}
	refill = time.Duration(capacity/rate*1e6+1e5) * time.Microsecond
	hh.advance(refill)
	return capacity, refill
}

// spendAll spends subject's tokens of r one at a time at the holder's
// clock until one is denied, and returns how many were admitted.
func spendAll(t *testing.T, hh *heldHolder, r *rules.Rule, subject string) int {
	t.Helper()
	now := hh.clock.Load()
	n := 0
	for ; n <= 2*int(r.Burst); n++ {
		if res, _, ok := hh.Spend(context.Background(), r, subject, 1, now); !ok || !res.Allowed {
			break
		}
	}
	return n
}

// lendFromCopy lends held of subject's copy (a held spend) for hold.
func lendFromCopy(t *testing.T, hh *heldHolder, r *rules.Rule, subject string, held float64, hold time.Duration) {
	t.Helper()
	h, ok := hh.SpendHeld(context.Background(), r, subject, held, hh.clock.Load(), hold.Microseconds(), math.MaxInt64)
	if !ok || !h.Allowed {
		t.Fatalf("held spend of %v: ok %v, %+v", held, ok, h)
	}
}

// A copy whose lease lapsed (its term shortened by a rules reload, so that
// a hold made under the longer one outlasts it) is not forgotten while it
// has tokens lent, even with its subject idle: a new clone of the default
// lease, renewed, would refill to the whole cap behind the tokens the
// held spend's delegate may still spend. Until the hold ends, what the
// subject admits and what is lent stay within the cap.
func TestHeldCopyNotForgottenWhileLent(t *testing.T) {
	c := harness.StartCoordinators(t, 1, heldRules)
	r := rule(t, heldRules, "shared")
	rl := &renewLog{}
	hh, _ := startHeldHolderVia(t, c, holder.Options{Holder: "a", IdleAfter: time.Second}, rl.wrap)
	const subject = "user=a"
	capacity, refill := fillCopy(t, hh, r, subject)
	held := 0.6 * capacity
	// Within the 20s term's validity, and past the 2s term's below.
	const hold = 15 * time.Second
	end := hh.clock.Load() + hold.Microseconds()
	lendFromCopy(t, hh, r, subject, held, hold)

	short, err := rules.Parse("rules.yaml", []byte(strings.Replace(heldRules, "{period: 20s, default_share: 1}", "{period: 2s, default_share: 1}", 1)))
	if err != nil {
		t.Fatal(err)
	}
	c.SetRules(short)
	from := rl.count()
	hh.advance(10 * time.Second) // the 20s term's renew point
	rl.waitDefault(t, from, func(g *rationv1.Grant) bool { return g.GetDurationUs() == 2e6 })
	// Past the 2s term's validity: the copy's lease lapsed under the hold,
	// and its subject has been idle for IdleAfter. The round renews the
	// default lease after its full scan.
	from = rl.count()
	hh.advance(2100 * time.Millisecond)
	rl.waitDefault(t, from, anyGrant)
	waitValid(t, hh, r)
	now := hh.advance(refill)
	if now >= end {
		t.Fatalf("the hold ended at %d, before the check at %d", end, now)
	}
	n := spendAll(t, hh, r, subject)
	t.Logf("during the hold, %v lent: the subject admitted %d (cap %v)", held, n, capacity)
	if float64(n)+held > capacity+1e-9 {
		t.Errorf("the subject admitted %d with %v still lent: %v over the cap %v", n, held, float64(n)+held-capacity, capacity)
	}
}

// waitValid waits until the holder's default lease of r is valid.
func waitValid(t *testing.T, hh *heldHolder, r *rules.Rule) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, _, valid := hh.Share(r.Name, rules.DefaultSubject); valid {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the default lease was not valid again after its renewal")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A holder that stops while a copy of its default lease has tokens lent
// does not release the default lease: the coordinator would stop
// reserving it (and grant it to others) while the held spend's delegate
// may still spend what was lent. The lease is left to expire, and a
// holder arriving meanwhile is granted nothing of it.
func TestHeldCopyKeepsDefaultLeaseAtShutdown(t *testing.T) {
	c := harness.StartCoordinators(t, 1, heldRules)
	r := rule(t, heldRules, "shared")
	reg := prometheus.NewRegistry()
	a, stop := startHeldHolderVia(t, c, holder.Options{Holder: "a", Registry: reg}, nil)
	capacity, refill := fillCopy(t, a, r, "user=a")
	held := 0.6 * capacity
	lendFromCopy(t, a, r, "user=a", held, 2*time.Second)
	var id uint64
	for _, l := range listLeasesOf(t, c) {
		if l.Holder == a.Name() {
			id = l.LeaseId
		}
	}
	if id == 0 {
		t.Fatal("the coordinator holds no lease of the holder")
	}
	stop()

	kept := false
	for _, l := range listLeasesOf(t, c) {
		kept = kept || l.LeaseId == id
	}
	unreleased := harness.Counter(t, reg, "ration_agent_lease_unreleased_total")
	b := startHeldHolder(t, c, "b")
	if _, _, ok := b.Spend(context.Background(), r, "user=b", 1, b.clock.Load()); !ok {
		t.Fatal("b holds no lease of the rule")
	}
	bCap, _, _ := b.Share(r.Name, rules.DefaultSubject)
	b.advance(refill)
	n := spendAll(t, b, r, "user=b")
	t.Logf("lease %d kept %v, unreleased %v; b granted cap %v, admitted %d, with %v lent", id, kept, unreleased, bCap, n, held)
	if !kept || unreleased != 1 {
		t.Errorf("the default lease %d, lent from, was released at shutdown (kept %v, unreleased %v)", id, kept, unreleased)
	}
	if bCap+held > r.Burst+1e-9 || float64(n)+held > r.Burst+1e-9 {
		t.Errorf("b was granted cap %v and admitted %d while %v was lent: over the burst %v", bCap, n, held, r.Burst)
	}
}

// A default lease that shrinks below what a copy has lent does not
// confirm the shrink until the loan is repaid: confirmed, the coordinator
// would reserve only the new cap and grant another holder the rest, while
// the held spend's delegate may still spend the larger loan. Holder a
// lends 90% of the quota from a copy; b arrives, so a's share halves at
// its renewal; b, renewed after a's confirming renewal, gets only what a's
// old cap left.
func TestHeldCopyKeepsShrinkUnconfirmed(t *testing.T) {
	c := harness.StartCoordinators(t, 1, heldRules)
	r := rule(t, heldRules, "shared")
	la, lb := &renewLog{}, &renewLog{}
	a, _ := startHeldHolderVia(t, c, holder.Options{Holder: "a"}, la.wrap)
	b, _ := startHeldHolderVia(t, c, holder.Options{Holder: "b"}, lb.wrap)
	capacity, refill := fillCopy(t, a, r, "user=a")
	held := 0.9 * capacity
	lendFromCopy(t, a, r, "user=a", held, 15*time.Second)
	if _, _, ok := b.Spend(context.Background(), r, "user=b", 1, b.clock.Load()); !ok {
		t.Fatal("b holds no lease of the rule")
	}

	from := la.count()
	a.advance(10 * time.Second) // a's renew point, before its hold ends
	i, g := la.waitDefault(t, from, func(g *rationv1.Grant) bool { return g.GetCap() < capacity })
	// The shrink halves a's cap: it is confirmed, or not, at once.
	la.waitDefault(t, i+1, anyGrant)
	from = lb.count()
	b.advance(11 * time.Second) // b's renew point
	_, gb := lb.waitDefault(t, from, anyGrant)
	deadline := time.Now().Add(10 * time.Second)
	for bCap, _, _ := b.Share(r.Name, rules.DefaultSubject); bCap != gb.GetCap(); bCap, _, _ = b.Share(r.Name, rules.DefaultSubject) {
		if time.Now().After(deadline) {
			t.Fatalf("b did not adopt its renewal's cap %v", gb.GetCap())
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.advance(refill)
	n := spendAll(t, b, r, "user=b")
	t.Logf("a shrank to cap %v with %v lent; b was then granted cap %v and admitted %d", g.GetCap(), held, gb.GetCap(), n)
	if gb.GetCap()+held > r.Burst+1e-9 || float64(n)+held > r.Burst+1e-9 {
		t.Errorf("b was granted cap %v and admitted %d while a's copy had %v lent: over the burst %v", gb.GetCap(), n, held, r.Burst)
	}
}
