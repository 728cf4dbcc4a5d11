package holder

import (
	"context"
	"math"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/rules"
)

// Take spends cost from the lease of (rule, subject) at now (from Now). ok
// is false when there is no valid lease: the caller applies the rule's
// failure policy. Until a quota's first answer arrives, its decisions wait
// for it, up to ColdStart after the quota was added (by the first of them
// or by Prepare); no other call does any I/O or waits.
func (l *Leases) Take(ctx context.Context, r *rules.Rule, subject string, cost float64, now int64) (res bucket.Result, ok bool) {
	res, _, ok = l.Spend(ctx, r, subject, cost, now)
	return res, ok
}

// Spend is Take, and reports where the tokens came from: a refund must go
// back there (Refund), and only while that lease holds them.
func (l *Leases) Spend(ctx context.Context, r *rules.Rule, subject string, cost float64, now int64) (res bucket.Result, src Source, ok bool) {
	if r.Lease.DefaultShare > 0 && subject != "" {
		if subject == rules.DefaultSubject {
			// The rule's default quota is never spent on itself: it is
			// every subject's. The agent refuses this name before it gets
			// here; no caller may make a quota its own copy.
			return bucket.Result{}, Source{}, false
		}
		return l.takeShared(ctx, r, subject, cost, now, nil)
	}
	q := l.lookup(r.Name, subject)
	if q == nil {
		q = l.add(r.Name, subject, r.Burst, r.Rate, true)
	}
	now = l.waitFirst(ctx, q, now, math.MaxInt64)
	q.mu.Lock()
	q.count(cost, now)
	res, ok, flag := l.spendOwn(q, cost, now)
	src = q.ownSource()
	q.mu.Unlock()
	if flag {
		// The slice ran dry: the loop decides whether the demand is worth
		// asking for more at once.
		l.flag(q)
	}
	return res, src, ok
}

// Source is where a Spend took its tokens: a subject's own lease or its
// copy of the rule's default lease, and which lease that was. Refund
// needs it. The zero Source refunds nothing.
type Source struct {
	q  *quota
	cp *lease.Holding // the copy spent; nil for the own lease
	id uint64
	// A decision split between the two (splitShared): fromCopy of its
	// cost came from the copy cp of lease copyID, the rest from the own
	// lease id.
	fromCopy float64
	copyID   uint64
}

// Shared reports whether the tokens came from the subject's copy of its
// rule's default lease (lease.default_share).
func (s Source) Shared() bool { return s.cp != nil }

// ownSource is the Source of a spend of q's own lease; q.mu held.
func (q *quota) ownSource() Source { return Source{q: q, id: q.h.Lease.ID} }

// copySource is the Source of a spend of q's copy; q.mu held.
func (q *quota) copySource() Source { return Source{q: q, cp: q.cp, id: q.cp.Lease.ID} }

// Ref is a quota of this holder found once, for a caller that decides the
// same (rule, subject) often: its Spend skips the lookup, the first-grant
// wait and the default-share branch of Leases.Spend. The zero Ref finds
// nothing.
type Ref struct {
	l *Leases
	q *quota
}

// Ref finds the quota of (r, subject) if this holder has added it (a
// first Spend adds it). A rule with lease.default_share has none: its
// subjects spend their copy of the default lease first (Spend).
func (l *Leases) Ref(r *rules.Rule, subject string) Ref {
	if r.Lease.DefaultShare > 0 {
		return Ref{}
	}
	q := l.lookup(r.Name, subject)
	if q == nil {
		return Ref{}
	}
	return Ref{l: l, q: q}
}

// Spend is Leases.Spend of ref's quota, now (Leases.Now, read here), when
// it can be decided on the quota's lease at once, with bucket.Result's fields a lease sets as
// results of their own (a Result is too large to return cheaply). ok is
// false, and nothing was spent or counted, when ref finds nothing, the
// first answer has not arrived, or the lease is not valid at now
// (expired, refused, or given back when the quota was forgotten for
// idleness). The caller then calls Leases.Spend, which waits for a first
// grant, adds the quota again, or reports that the rule's failure policy
// decides; and takes a new Ref.
func (ref Ref) Spend(cost float64) (allowed bool, remaining float64, reset, retryAfter time.Duration, ok bool) {
	if ref.q == nil || !ref.q.answered() {
		return false, 0, 0, 0, false
	}
	return ref.SpendAt(cost, ref.l.Now())
}

// SpendAt is Spend at now (from Leases.Now), for a caller that decides
// many requests at one reading of the clock (a batch).
func (ref Ref) SpendAt(cost float64, now int64) (allowed bool, remaining float64, reset, retryAfter time.Duration, ok bool) {
	allowed, remaining, reset, retryAfter, _, ok = ref.SpendFrom(cost, now)
	return allowed, remaining, reset, retryAfter, ok
}

// SpendFrom is SpendAt, and reports where the tokens came from, for a
// caller that may refund them (Leases.Refund).
func (ref Ref) SpendFrom(cost float64, now int64) (allowed bool, remaining float64, reset, retryAfter time.Duration, src Source, ok bool) {
	q := ref.q
	if q == nil || !q.answered() {
		return false, 0, 0, 0, Source{}, false
	}
	q.mu.Lock()
	if !q.h.Valid(now) {
		q.mu.Unlock()
		return false, 0, 0, 0, Source{}, false
	}
	q.count(cost, now)
	allowed, flag := q.spendValid(cost, now)
	remaining = q.h.Balance
	reset, retryAfter = waits(&q.h, allowed, cost)
	src = q.ownSource()
	q.mu.Unlock()
	if flag {
		ref.l.flag(q) // as Leases.Spend does
	}
	return allowed, remaining, reset, retryAfter, src, true
}

// waitFirst waits, if q's first answer has not arrived, until it does or
// its cold start ends (or limit passes, or ctx is done), and returns the
// time then.
func (l *Leases) waitFirst(ctx context.Context, q *quota, now, limit int64) int64 {
	if q.answered() {
		return now
	}
	// Every decision of a new quota waits for its grant, not only the
	// one that added it: a second caller of the same new subject would
	// otherwise fall to the failure policy.
	q.mu.Lock()
	until, ready := min(q.coldUntil, limit), q.ready
	q.mu.Unlock()
	if wait := time.Duration(until-l.Now()) * time.Microsecond; wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-ready:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	return l.Now()
}

// spendOwn spends cost from q's own lease at now; q.mu held. flag is true
// when the slice just ran dry (the caller flags q once q.mu is released).
func (l *Leases) spendOwn(q *quota, cost float64, now int64) (res bucket.Result, ok, flag bool) {
	if !q.h.Valid(now) {
		return bucket.Result{}, false, false
	}
	allowed, flag := q.spendValid(cost, now)
	return result(&q.h, allowed, cost), true, flag
}

// spendValid spends cost from q's own lease, valid at now; q.mu held. flag
// as spendOwn's.
func (q *quota) spendValid(cost float64, now int64) (allowed, flag bool) {
	allowed = q.h.Spend(now, cost)
	if !allowed && !q.dry {
		q.dry, flag = true, true
	}
	return allowed, flag
}

// result is a decision's answer from the holding it was taken from.
func result(h *lease.Holding, allowed bool, cost float64) bucket.Result {
	res := bucket.Result{Allowed: allowed, Remaining: h.Balance}
	res.Reset, res.RetryAfter = waits(h, allowed, cost)
	return res
}

// waits is how long until h is full again, and (denied) until cost fits:
// 0 when h does not refill.
func waits(h *lease.Holding, allowed bool, cost float64) (reset, retryAfter time.Duration) {
	bal, rate := h.Balance, h.Lease.Rate
	if rate > 0 {
		reset = micros((h.Lease.Cap - bal) / rate)
		if !allowed {
			retryAfter = micros((cost - bal) / rate)
		}
	}
	return reset, retryAfter
}

// Prepare starts acquiring the lease of (rule, subject) if this agent has
// not asked for it yet, without waiting. A request that decides several
// leased subjects prepares them all before its first Take: their first
// grants then share requests, and their decisions wait out one cold start
// together instead of one after another.
func (l *Leases) Prepare(r *rules.Rule, subject string) {
	if r.Lease.DefaultShare > 0 && subject != "" {
		// Its decisions wait for the rule's default lease, if for anything
		// (and DefaultSubject's are refused by Spend).
		if l.lookup(r.Name, rules.DefaultSubject) == nil {
			l.addDefault(r)
		}
		return
	}
	if l.lookup(r.Name, subject) == nil {
		l.add(r.Name, subject, r.Burst, r.Rate, true)
	}
}

// Share reports the sizes of the lease this agent holds for (rule,
// subject) now: its cap and rate, and whether it is valid.
func (l *Leases) Share(rule, subject string) (capacity, rate float64, valid bool) {
	q := l.lookup(rule, subject)
	if q == nil {
		return 0, 0, false
	}
	now := l.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.h.Lease.Cap, q.h.Lease.Rate, q.h.Valid(now)
}

// Refund gives back tokens a denied multi-rule request took from src (a
// Spend's); they return to the local bucket they came from (never above
// its cap), never to the coordinator. They land only while that bucket
// still holds the lease they were spent from: once it was dropped,
// released or let go and another granted (or the copy forgotten and
// cloned again), the new lease's tokens are the coordinator's count
// alone, and a refund into it would add tokens it never gave; the refund
// is dropped (under-admission, never over).
func (l *Leases) Refund(src Source, cost float64) {
	q := src.q
	if q == nil || !(cost > 0) {
		return
	}
	now := l.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	if src.fromCopy > 0 {
		back := min(cost, src.fromCopy)
		q.refundTo(src.cp, src.copyID, back, now)
		cost -= back
		src.cp = nil // the rest went to the own lease
	}
	if cost > 0 {
		q.refundTo(src.cp, src.id, cost, now)
	}
}

// refundTo gives amount back to the holding a spend took it from: the
// copy cp (still q's copy), or the own lease when cp is nil, and only
// under the same lease id; q.mu held.
func (q *quota) refundTo(cp *lease.Holding, id uint64, amount float64, now int64) {
	h := &q.h
	if cp != nil {
		h = q.cp // nil once forgotten: the tokens are lost, never doubled
		if h != cp {
			return
		}
	}
	if h != nil && h.Lease.ID == id && h.Valid(now) {
		// Within the cap less what is lent (held RLQS spends), as every
		// other step that adds to a balance.
		h.Balance = min(max(0, h.Lease.Cap-h.Lent), h.Available(now)+amount)
	}
}

func micros(sec float64) time.Duration {
	if !(sec > 0) {
		return 0
	}
	// math.Ceil is a call; on this hot path the comparison is cheaper.
	// Past maxMicros the conversion would overflow: the longest duration.
	us := sec * 1e6
	if us >= maxMicros {
		return math.MaxInt64
	}
	n := int64(us)
	if float64(n) < us {
		n++
	}
	return time.Duration(n) * time.Microsecond
}

// maxMicros is the most microseconds a time.Duration holds, as a float.
const maxMicros = float64(math.MaxInt64 / int64(time.Microsecond))
