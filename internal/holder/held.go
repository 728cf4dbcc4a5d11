package holder

import (
	"context"
	"math"
	"sync"
	"sync/atomic"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/rules"
)

// A held spend is a decision whose tokens are spent later, elsewhere: an
// RLQS take (internal/rlqs), whose cost Envoy spends under its assignment
// for up to heldFor after the take. Spent as a plain spend, the tokens
// would leave the lease's balance and the balance would refill behind
// them while Envoy has yet to spend them: a window around the
// assignment's last moments would admit the lease's cap from the balance
// and the assignment's tokens too. So a held spend lends them instead
// (lease.Holding.Lend, amount cost, rate 0): they stay counted against
// the cap, beside the balance, until the hold is over, and then are
// repaid with nothing back (Envoy may have spent them all). The renewal
// loop repays loans whose hold has ended (repayHeld).
//
// A hold must end while the lease may still be spent (its ValidUntil) and,
// for a promoted auto subject, before the promotion's mark it was decided
// under lapses: past either, the tokens would be spent under no lease the
// coordinator or the store still counts. A held spend that would outlast
// them is refused (Held.Short) and charges nothing.

// Held is a held spend's answer.
type Held struct {
	bucket.Result
	// Short: refused, with nothing charged, only because the hold would
	// outlast what the lease (or the caller's until) may be spent for.
	// Fund is then how long from now (µs, on Now) a hold could last.
	Short bool
	Fund  int64
}

// hold is a held spend's terms and, once decided, whether it was refused
// for being too long; nil for a plain spend.
type hold struct {
	heldFor, until int64
	short          bool
	fund           int64
}

// heldLoan is the cost of a held spend, lent out of a holding until end.
type heldLoan struct {
	q      *quota
	cp     *lease.Holding // the copy lent from; nil for q's own lease
	id     uint64         // the lease it was lent from
	amount float64
	end    int64
}

// heldLoans are the loans of held spends not repaid yet.
type heldLoans struct {
	mu   sync.Mutex // a leaf: taken under a quota's lock, never the other way
	list []heldLoan
	next atomic.Int64 // the earliest end in list; 0 when empty
}

// SpendHeld decides cost for (r, subject) at now (from Now) like Spend,
// but as a held spend (see Held): the tokens are lent from the holding
// Spend would have spent (the subject's own lease, or its copy of the
// rule's default lease) until heldFor after now, and repaid with nothing
// back once that is over. until (on Now) is a time the hold must also end
// by, math.MaxInt64 for none. Tokens lent cannot be refunded: a held
// spend has no Source. ok is false when there is no valid lease, as for
// Spend.
func (l *Leases) SpendHeld(ctx context.Context, r *rules.Rule, subject string, cost float64, now, heldFor, until int64) (Held, bool) {
	hd := &hold{heldFor: max(1, heldFor), until: until}
	var res bucket.Result
	var ok bool
	if r.Lease.DefaultShare > 0 && subject != "" {
		if subject == rules.DefaultSubject {
			return Held{}, false // as Spend
		}
		res, _, ok = l.takeShared(ctx, r, subject, cost, now, hd)
	} else {
		res, ok = l.spendOwnHeld(ctx, r, subject, cost, now, hd)
	}
	if !hd.short || res.Allowed {
		// Lent after all (the copy was too short, the own lease was not).
		return Held{Result: res}, ok
	}
	return Held{Result: res, Short: true, Fund: hd.fund}, ok
}

// spendOwnHeld is SpendHeld of a quota without a default share.
func (l *Leases) spendOwnHeld(ctx context.Context, r *rules.Rule, subject string, cost float64, now int64, hd *hold) (bucket.Result, bool) {
	q := l.lookup(r.Name, subject)
	if q == nil {
		q = l.add(r.Name, subject, r.Burst, r.Rate, true)
	}
	now = l.waitFirst(ctx, q, now, math.MaxInt64)
	q.mu.Lock()
	res, ok, flag := l.lendOwn(q, cost, now, hd)
	if ok && !hd.short {
		// A refusal for the hold's length alone is not demand: it asks
		// again, shorter.
		q.count(cost, now)
	}
	q.mu.Unlock()
	if flag {
		l.flag(q)
	}
	return res, ok
}

// lendOwn is spendOwn for a held spend: it lends cost out of q's own
// lease (the caller counts the demand); q.mu held.
func (l *Leases) lendOwn(q *quota, cost float64, now int64, hd *hold) (res bucket.Result, ok, flag bool) {
	if !q.h.Valid(now) {
		return bucket.Result{}, false, false
	}
	lent := l.lendHeld(q, &q.h, nil, cost, now, hd)
	if !lent && !hd.short && !q.dry {
		q.dry, flag = true, true
	}
	return result(&q.h, lent, cost), true, flag
}

// lendHeld lends cost out of h (q's own holding, or its copy cp) until
// hd.heldFor after now, and records the loan for repayHeld. It reports
// false when h is not valid, lacks the tokens, or cannot be spent for as
// long as the hold (hd.short, hd.fund set); q.mu held.
func (l *Leases) lendHeld(q *quota, h, cp *lease.Holding, cost float64, now int64, hd *hold) bool {
	if !h.Valid(now) {
		return false
	}
	end := now + hd.heldFor
	if limit := min(h.ValidUntil, hd.until); end > limit {
		hd.short, hd.fund = true, max(hd.fund, limit-now, 0)
		return false
	}
	if !h.Lend(now, cost, 0, 0) {
		return false
	}
	l.held.add(heldLoan{q: q, cp: cp, id: h.Lease.ID, amount: cost, end: end})
	return true
}

func (hl *heldLoans) add(ln heldLoan) {
	hl.mu.Lock()
	hl.list = append(hl.list, ln)
	if n := hl.next.Load(); n == 0 || ln.end < n {
		hl.next.Store(ln.end)
	}
	hl.mu.Unlock()
}

// due is the earliest end of a loan not repaid yet, 0 for none.
func (hl *heldLoans) due() int64 { return hl.next.Load() }

// repayHeld repays the loans of held spends whose hold ended by now.
func (l *Leases) repayHeld(now int64) {
	hl := &l.held
	if n := hl.next.Load(); n == 0 || n > now {
		return
	}
	hl.mu.Lock()
	var due []heldLoan
	keep := hl.list[:0]
	var next int64
	for _, ln := range hl.list {
		if ln.end <= now {
			due = append(due, ln)
			continue
		}
		keep = append(keep, ln)
		if next == 0 || ln.end < next {
			next = ln.end
		}
	}
	clear(hl.list[len(keep):]) // no quota kept alive by a repaid loan
	hl.list = keep
	hl.next.Store(next)
	hl.mu.Unlock()
	for _, ln := range due {
		ln.repay(now)
	}
}

// repay ends ln: nothing comes back (Envoy may have spent it all). A loan
// of a lease since dropped or replaced (another id), or of a copy since
// forgotten, is gone with it: the new holding never counted it.
func (ln heldLoan) repay(now int64) {
	q := ln.q
	q.mu.Lock()
	defer q.mu.Unlock()
	h := &q.h
	if ln.cp != nil {
		if h = q.cp; h != ln.cp {
			return
		}
	}
	if h.Lease.ID == ln.id {
		h.Repay(now, ln.amount, 0, 0)
	}
}
