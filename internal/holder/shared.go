package holder

import (
	"context"
	"sync"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/rules"
)

// A leased rule with lease.default_share f leases the part f of every
// subject's budget once per rule: the quota of rules.DefaultSubject. This
// agent holds one lease of it (the "default lease"), and every subject the
// agent decides gets a copy of that lease: a lease.Holding that goes
// through exactly the commands and answers the default lease goes through
// (the same grants, renewals, adoptions, drops and releases, at the same
// times, with the same sequence numbers), but is spent on its subject
// alone. So each subject's copy spends at most what the coordinator
// counts this holder as having taken from the default quota, and the
// default quota's own conservation bounds every subject's admissions
// through the default part by f of B + r*T. A renewal gives back only what
// every copy gives back (the least of them), so no copy keeps tokens the
// pool has been given back.
//
// A copy is created as a clone of the default lease's holding, which is
// never spent: it is the copy of a subject untouched so far. For the same
// reason a copy may be forgotten once it is the same as a new clone would
// be: full again (or its lease no longer valid), and owing what the
// default lease owes. A shrink leaves a copy that had spent below the new
// cap owing less than the default lease (what it spent is not there to
// give back); forgotten then, it would no longer count in the least that
// the next renewal or release gives back, and the pool would be given
// tokens the subject already spent. So it is kept until that command has
// been sent (it zeroes every copy's debt alike).
//
// The rest of a subject's budget, 1-f, is its own quota, asked for only
// once the subject's copy runs dry: subjects that stay within their copy
// cost the coordinator nothing, and a subject's first decision needs no
// request of its own.

// addDefault adds the rule's default quota unless it exists.
func (l *Leases) addDefault(r *rules.Rule) *quota {
	return l.addQuota(r.Name, rules.DefaultSubject, r.Burst*r.Lease.Split(rules.DefaultSubject), r.Rate*r.Lease.Split(rules.DefaultSubject), true, func(q *quota) {
		q.isDefault = true
		q.copies = map[*quota]struct{}{}
	})
}

// copyOf gives q a copy of d's holding (a fresh clone), unless it has one
// of d already, and registers it with d so that it mirrors d from now on.
func (l *Leases) copyOf(d, q *quota) {
	if d == q {
		// A quota is never its own copy: both locks are one mutex.
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.removed || (q.cp != nil && q.def == d) {
		return
	}
	cp := d.h
	q.cp, q.def, q.owesLess = &cp, d, false
	d.copies[q] = struct{}{}
}

// mirror applies fn to every copy of d's holding, after d's own holding
// went through the same step; d.mu held.
func (d *quota) mirror(fn func(*lease.Holding)) {
	for c := range d.copies {
		c.mu.Lock()
		if c.cp != nil && c.def == d {
			fn(c.cp)
			// Only these steps change what a holding owes.
			c.owesLess = c.cp.Owed < d.h.Owed
		}
		c.mu.Unlock()
	}
}

// evictable reports whether q's copy, if any, may be forgotten at now: a
// new clone would hold no more than it does, and give back no more at the
// next renewal or release. q.mu held.
func (q *quota) evictable(now int64) bool {
	cp := q.cp
	if cp == nil {
		return true
	}
	// A copy with tokens lent (a held spend) is not forgotten: a new clone
	// would refill behind the tokens its delegate has yet to spend.
	return !q.owesLess && cp.Lent == 0 && (!cp.Valid(now) || cp.Available(now) >= cp.Lease.Cap)
}

// takeShared decides cost for subject of r, a rule with a default share:
// from the subject's copy of the default lease first, then from its own
// lease, asked for the first time the copy cannot pay. hd, for a held
// spend (SpendHeld), lends the cost instead; nil for a plain one.
func (l *Leases) takeShared(ctx context.Context, r *rules.Rule, subject string, cost float64, now int64, hd *hold) (bucket.Result, Source, bool) {
	d := l.lookup(r.Name, rules.DefaultSubject)
	if d == nil {
		d = l.addDefault(r)
	}
	// One cold start in all for this decision, whether it waits for the
	// default lease, the subject's own, or both; counted from now, the
	// caller's one clock read per batch (no clock read here per decision).
	limit := now + l.o.ColdStart.Microseconds()
	now = l.waitFirst(ctx, d, now, limit)
	if now-d.touched.Load() > 100_000 {
		// Every decision of the rule reads this; writing it only every
		// 100ms keeps its cache line shared between cores.
		d.touched.Store(now)
	}
	ownPart := r.Lease.DefaultShare < 1
	var q *quota
	for attempt := 0; ; attempt++ {
		q = l.lookup(r.Name, subject)
		if q == nil {
			q = l.add(r.Name, subject, r.Burst*r.Lease.Split(subject), r.Rate*r.Lease.Split(subject), false)
		}
		q.mu.Lock()
		if q.cp == nil || q.def != d {
			q.mu.Unlock()
			l.copyOf(d, q)
			q.mu.Lock()
		}
		if !q.removed {
			break
		}
		q.mu.Unlock()
		if attempt > 0 {
			// Removed twice in a row under our feet: not worth a third
			// look; nothing was spent.
			return bucket.Result{}, Source{}, false
		}
	}
	q.count(cost, now)
	if hd == nil {
		if q.cp.Spend(now, cost) {
			res, src := result(q.cp, true, cost), q.copySource()
			q.mu.Unlock()
			return res, src, true
		}
	} else if l.lendHeld(q, q.cp, q.cp, cost, now, hd) {
		res := result(q.cp, true, cost)
		q.mu.Unlock()
		return res, Source{}, true // lent: nothing to refund
	}
	copyValid := q.cp.Valid(now)
	if !ownPart || q.invalid {
		defer q.mu.Unlock()
		if !copyValid {
			return bucket.Result{}, Source{}, false
		}
		return result(q.cp, false, cost), Source{}, true
	}
	q.ownUsed = now
	if !q.own {
		// The copy cannot pay: from now on this subject has a lease of its
		// own too, and this decision waits for it like any first one.
		q.own = true
		q.coldUntil = now + l.o.ColdStart.Microseconds()
		q.mu.Unlock()
		l.mu.Lock()
		l.fresh = append(l.fresh, q)
		l.mu.Unlock()
		l.kick()
		now = l.waitFirst(ctx, q, now, limit)
		q.mu.Lock()
	} else if !q.answered() {
		q.mu.Unlock()
		now = l.waitFirst(ctx, q, now, limit)
		q.mu.Lock()
	}
	var res bucket.Result
	var ok, flag bool
	var src Source
	if hd == nil {
		res, ok, flag = l.spendOwn(q, cost, now)
		src = q.ownSource()
		if ok && !res.Allowed && copyValid {
			res, src = q.splitShared(res, src, cost, now)
		}
	} else {
		res, ok, flag = l.lendOwn(q, cost, now, hd)
	}
	if !ok && copyValid && q.cp != nil {
		// No own lease yet (or any more), but a valid copy that is dry:
		// a denial, not a failure.
		res, ok = result(q.cp, false, cost), true
	}
	q.mu.Unlock()
	if flag {
		l.flag(q)
	}
	return res, src, ok
}

// splitShared pays cost from q's copy and own lease together when
// neither holds it alone but both do: the copy gives what it has, the
// own lease the rest. Each refills on its own, so a subject paced within
// its rate would otherwise be refused while its two parts held the cost
// between them (half a token in each). res and src are the own lease's
// refusal, returned as they are when the two together lack the cost;
// q.mu held, the own lease answered.
func (q *quota) splitShared(res bucket.Result, src Source, cost float64, now int64) (bucket.Result, Source) {
	if q.cp == nil || q.removed {
		// Forgotten while the decision waited for the own lease (q.mu
		// released): nothing of the copy is this subject's any more.
		return res, src
	}
	fromCopy := q.cp.Available(now)
	if !(fromCopy > 0) || !q.h.Valid(now) || q.h.Available(now)+fromCopy < cost {
		return res, src
	}
	fromCopy = min(fromCopy, cost)
	q.cp.Balance -= fromCopy
	q.h.Balance = max(0, q.h.Balance-(cost-fromCopy))
	src.fromCopy, src.cp, src.copyID = fromCopy, q.cp, q.cp.Lease.ID
	return result(&q.h, true, cost), src
}

// demote gives back the own leases of subjects whose copies of the default
// lease have paid for all their decisions for demoteAfter: the subject goes
// back to its copy alone, and asks for its own lease again when the copy
// next runs dry (a new grant, waited for like any first one). A subject
// that needed its own lease again meanwhile keeps asking: its released
// lease is renewed, refused as expired, and granted afresh.
func (l *Leases) demote(ctx context.Context, qs []*quota, now int64) {
	rctx, cancel := l.callCtx(ctx)
	l.release(rctx, qs)
	cancel()
	n := 0
	for _, q := range qs {
		q.mu.Lock()
		if now-q.ownUsed > l.demoteAfter(q) {
			n++
			q.own = false
			q.h = lease.Holding{Quota: q.id, Validity: l.validity}
			q.nudged, q.confirm, q.dry, q.failed = false, false, false, ""
			// Its next first decision waits for the next grant.
			q.ready, q.readyOnce = make(chan struct{}), sync.Once{}
			q.got.Store(false)
		}
		q.mu.Unlock()
	}
	l.m.demoted.Add(float64(n))
}

// demoteAfter is how long a subject's copy of the default lease must have
// paid for every decision before its own lease goes back: one term of the
// copy's lease (the rule's lease.period), at most IdleAfter. Every agent
// that restarts starts its copies nearly empty (the pool of the default
// quota only gets back what the least spent copy of the old process gave
// back), so every subject active there needs its own lease for its first
// seconds; kept for IdleAfter (a minute) after the copies refilled, a
// rolling restart left every active subject with leases of its own (and
// their renewals and nudges) for over a minute. A subject whose demand
// stays above its copy's refill keeps its own lease (its copy never pays
// for a whole term); one that goes back and forth costs at most a release
// and a grant per term, what keeping the lease would cost in renewals.
// q.mu held.
func (l *Leases) demoteAfter(q *quota) int64 {
	d := l.o.IdleAfter.Microseconds()
	if q.cp != nil && q.cp.Lease.Term > 0 {
		d = min(d, q.cp.Lease.Term)
	}
	return d
}
