package holder

import (
	"context"

	"github.com/ration-dev/ration/internal/rules"
)

// Loan is tokens and a refill rate lent from one lease to a delegate that
// spends them on its own (an Envoy RLQS assignment, internal/rlqs): Repay
// ends them. The zero Loan repays nothing.
type Loan struct {
	q  *quota
	id uint64
}

// Offer is what a lease can lend at the time: Tokens spendable now, Rate
// of refill not lent yet (counting what the delegate holds already, see
// Lend), the lease's whole rate, and ValidUntil, on Now, after which
// nothing of the lease may be spent (a delegate's spending must end
// before it).
type Offer struct {
	Tokens, Rate, LeaseRate float64
	// Cap is the most the lease holds and lends at once.
	Cap        float64
	ValidUntil int64
	// Continues: the delegate's loan so far (Lend's prev) is of this
	// lease, so what it lent still counts here.
	Continues bool
}

// Plan sizes a loan from what the lease offers: the tokens and the rate to
// lend, 0 and 0 for none.
type Plan func(o Offer) (tokens, rate float64)

// Lend lends from the lease of (r, subject) at now what plan asks, under
// the quota's lock so that no decision spends between the plan and the
// loan. prev is the delegate's loan so far, of which it holds held rate:
// if it is of the same lease, the new loan supersedes it (lease.Holding.
// Lend). Like a first Spend it adds the quota, but it never waits for its
// first grant: a loan is counted from the now it was planned at, which a
// wait would make stale (an unanswered quota is not valid: ok false, and
// the delegate asks again). ok is false when there is no valid lease (the caller applies the
// rule's failure policy); tokens and rate are 0 when the plan asked for
// nothing or more than the lease holds. Rules with lease.default_share
// lend nothing (their subjects spend copies of one lease: ok false, see
// internal/rlqs).
func (l *Leases) Lend(_ context.Context, r *rules.Rule, subject string, now int64, prev Loan, held float64, plan Plan) (loan Loan, tokens, rate float64, ok bool) {
	if r.Lease.DefaultShare > 0 {
		return Loan{}, 0, 0, false
	}
	q := l.lookup(r.Name, subject)
	if q == nil {
		q = l.add(r.Name, subject, r.Burst, r.Rate, true)
	}
	q.mu.Lock()
	if !q.h.Valid(now) {
		q.mu.Unlock()
		return Loan{}, 0, 0, false
	}
	q.lastUsed = now
	loan = Loan{q: q, id: q.h.Lease.ID}
	if prev != loan {
		held = 0 // another lease's loan: nothing of it is lent here
	}
	held = min(max(0, held), q.h.LentRate)
	wantT, wantR := plan(Offer{
		Tokens: q.h.Available(now), Rate: max(0, q.h.Lease.Rate-q.h.LentRate+held),
		LeaseRate: q.h.Lease.Rate, Cap: q.h.Lease.Cap, ValidUntil: q.h.ValidUntil, Continues: prev == loan,
	})
	if (wantT > 0 || wantR > 0) && q.h.Lend(now, wantT, wantR, held) {
		tokens, rate = wantT, wantR
	} else if (wantT > 0 || wantR > 0) && !q.dry {
		q.dry = true
		defer l.flag(q)
	}
	q.mu.Unlock()
	return loan, tokens, rate, true
}

// ValidUntil is when the lease of (r, subject) may no longer be spent,
// on Now: 0 when there is none valid.
func (l *Leases) ValidUntil(r *rules.Rule, subject string) int64 {
	q := l.lookup(r.Name, subject)
	if q == nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.h.Valid(l.Now()) {
		return 0
	}
	return q.h.ValidUntil
}

// Repay ends lent tokens and rate of loan: the delegate can no longer
// spend them. back of the tokens were never spent and go back to the
// lease's balance, if the loan's lease is still held and valid (never
// into another lease of the quota: its tokens are the coordinator's count
// alone); the rest are gone.
func (l *Leases) Repay(loan Loan, lent, rate, back float64) {
	q := loan.q
	if q == nil {
		return
	}
	now := l.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.h.Lease.ID == loan.id {
		q.h.Repay(now, lent, rate, back)
	}
}

// Count records n tokens asked for at now by a delegate (what an Envoy
// reported as allowed and denied over the last over µs), for the quota's
// demand: the renewal reports the delegate's use, not the loans' lumps.
// Such counts come in lumps, one per reporting interval (quota.window).
func (l *Leases) Count(r *rules.Rule, subject string, n float64, now, over int64) {
	q := l.lookup(r.Name, subject)
	if q == nil || !(n > 0) {
		return
	}
	q.mu.Lock()
	q.count(n, now)
	if over > 0 {
		q.lump = over
	}
	q.mu.Unlock()
}
