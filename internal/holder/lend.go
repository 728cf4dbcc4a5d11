package holder

import (
	"context"
	"math"

	"github.com/ration-dev/ration/internal/rules"
)

// Loan is tokens lent from one lease to a delegate that spends them on its
// own (an Envoy RLQS assignment, internal/rlqs): Repay ends them. The zero
// Loan repays nothing.
type Loan struct {
	q  *quota
	id uint64
}

// Plan sizes a loan from what the lease offers at the time: avail tokens
// spendable now, and validUntil, on Now, after which nothing of the lease
// may be spent (a delegate's spending must end before it). It returns the
// tokens to lend, 0 for none.
type Plan func(avail float64, validUntil int64) float64

// Lend lends from the lease of (r, subject) at now what plan asks, under
// the quota's lock so that no decision spends between the plan and the
// loan. Like a first Spend it adds the quota and waits out its cold start.
// ok is false when there is no valid lease (the caller applies the rule's
// failure policy); lent is 0 when the plan asked for nothing or more than
// the lease holds. Rules with lease.default_share lend nothing (their
// subjects spend copies of one lease: ok false, see internal/rlqs).
func (l *Leases) Lend(ctx context.Context, r *rules.Rule, subject string, now int64, plan Plan) (loan Loan, lent float64, ok bool) {
	if r.Lease.DefaultShare > 0 {
		return Loan{}, 0, false
	}
	q := l.lookup(r.Name, subject)
	if q == nil {
		q = l.add(r.Name, subject, r.Rate, true)
	}
	now = l.waitFirst(ctx, q, now, math.MaxInt64)
	q.mu.Lock()
	if !q.h.Valid(now) {
		q.mu.Unlock()
		return Loan{}, 0, false
	}
	q.lastUsed = now
	want := plan(q.h.Available(now), q.h.ValidUntil)
	if want > 0 && q.h.Lend(now, want) {
		lent = want
	} else if want > 0 && !q.dry {
		q.dry = true
		defer l.flag(q)
	}
	loan = Loan{q: q, id: q.h.Lease.ID}
	q.mu.Unlock()
	return loan, lent, true
}

// Repay ends lent tokens of loan: the delegate can no longer spend them.
// back of them were never spent and go back to the lease's balance, if
// the loan's lease is still held and valid (never into another lease of
// the quota: its tokens are the coordinator's count alone); the rest are
// gone.
func (l *Leases) Repay(loan Loan, lent, back float64) {
	q := loan.q
	if q == nil {
		return
	}
	now := l.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.h.Lease.ID == loan.id {
		q.h.Repay(now, lent, back)
	}
}

// Count records n tokens asked for at now by a delegate (what an Envoy
// reported as allowed and denied), for the quota's demand: the renewal
// reports the delegate's use, not the loans' lumps.
func (l *Leases) Count(r *rules.Rule, subject string, n float64, now int64) {
	q := l.lookup(r.Name, subject)
	if q == nil || !(n > 0) {
		return
	}
	q.mu.Lock()
	q.count(n, now)
	q.mu.Unlock()
}
