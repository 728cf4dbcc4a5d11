package lease

// The hand-over of a funded quota from its funding to its own part.
//
// While a funding is active, a sublease's term is cut to the funding's
// NotAfter: a sublease never outlives its parent. Near NotAfter that term
// gets too short to use: a holder stops spending a pause (and the drift)
// before its term ends, and renews at a fraction of it, so as NotAfter
// nears every answer is shorter than the last and the last ones are worth
// nothing. No answer reaches past NotAfter, so every holder is left without
// a lease from shortly before NotAfter until its first renewal after it is
// answered, although the own part (a region's safe share) never expires.
//
// So in the last quarter of a lease period before NotAfter (the hand-over),
// a quota with an own part answers with a full term, sized out of the own
// part alone: the lease's fair share scaled down to the own part, and
// within what the answers of the other leases that may be spent after
// NotAfter leave of it. A quota without an own part (a safe share of 0)
// keeps cutting terms at NotAfter: it has nothing to hand over to.
//
// Why the bound still holds. Conservation (doc.go) needs, at every moment,
// the pool's room plus the reserved caps of the answers still spendable to
// fit in the quota's capacity, and their rates in its rate: (own + funding)
// before NotAfter, own after it. Before NotAfter the hand-over answers are
// sized like any other, within (own + funding) less every reservation. After
// NotAfter, the answers still spendable are those whose term reaches past
// it: hand-over answers only, every other one having ended by NotAfter (its
// holder stops before its term ends). Their sizes sum to at most the own
// part: each was granted within the own part less the others that reach
// past NotAfter (past, below), and a lease's older answer that reaches past
// it stays counted at its size until the holder confirms the newer one or
// it ends. The pool's room after NotAfter is own less every reservation
// (refill trims it, reshape). So after NotAfter the quota holds what its own
// part may hold, and refills at no more than its own rate: the regional
// quota is still a Holding of the upstream lease (until NotAfter) plus its
// own part, and admitted <= B + r*T carries down as before. Tokens the
// hand-over answers took from the pool before NotAfter may have come from
// the upstream lease: they are moved, not minted, into buckets whose
// capacity the own part holds, the same move any sublease's top-up makes.

// handOverFraction is the part of a lease period before the funding's
// NotAfter in which answers are handed over to the own part. A region
// renews upstream at its renew point, -upstream-renew-at (0.5 by default),
// of a lease of the same period: a healthy region's funding has about half
// a period left when it renews (less the upstream round trip), so it hands
// over only once its upstream renewal is a quarter period late, as when it
// is cut off. (A renew point past 0.75 would hand over at every upstream
// renewal.) A holder whose last
// funded answer had at least a quarter period left renews before that
// answer ends (at its renew point, which is at most its validity), and
// that renewal is answered with a full term.
const handOverFraction = 4

// period is the lease period l's answers get: the quota's, or its own
// bounds'.
func (l *lease) period(q *quota) int64 {
	if l.Bounds != nil && l.Bounds.Period > 0 {
		return l.Bounds.Period
	}
	return q.cfg.LeasePeriod
}

// handingOver reports whether an answer of a lease with the given period,
// at now, is a hand-over answer: the funding is active and ends within a
// quarter period, and the quota has an own part to hand over to.
func (q *quota) handingOver(now, period int64) bool {
	return q.base.Burst > 0 && q.fund.Active(now) && q.fund.NotAfter-now < period/handOverFraction
}

// handOverShare scales a fair share of the whole quota (own + funding) down
// to the own part.
func (q *quota) handOverShare(t target) target {
	return target{cap: t.cap * part(q.base.Burst, q.cfg.Burst), rate: t.rate * part(q.base.Rate, q.cfg.Rate)}
}

func part(own, whole float64) float64 {
	if whole <= 0 {
		return 0
	}
	return min(1, own/whole)
}

// handOverTarget is l's target in a hand-over answer: its share of the own
// part, within what the other leases' answers that reach past NotAfter
// leave of it. It costs O(n) in the quota's leases: only hand-over answers
// pay it.
func (q *quota) handOverTarget(t target, l *lease) target {
	t = q.handOverShare(t)
	var pastCap, pastRate float64
	for _, o := range q.leases {
		if o != l {
			c, r := q.past(o)
			pastCap, pastRate = pastCap+c, pastRate+r
		}
	}
	return target{cap: max(0, min(t.cap, q.base.Burst-pastCap)), rate: max(0, min(t.rate, q.base.Rate-pastRate))}
}

// past is what lease o may still be spending under after the funding's
// NotAfter: nothing if every answer's term ended by then (ReclaimAt, the
// latest term's end plus the margin, is no later than NotAfter plus the
// margin); its reserved sizes if an older answer might reach past it
// (ResUntil covers every older answer's term plus the margin); otherwise
// its latest sizes, which every older answer still in use is within (a
// renewal that shrinks either size extends ResUntil over them).
func (q *quota) past(o *lease) (c, r float64) {
	end := q.fund.NotAfter + q.cfg.SafetyMargin
	switch {
	case o.ReclaimAt <= end:
		return 0, 0
	case o.ResUntil > end:
		return o.ResCap, o.ResRate
	}
	return o.Cap, o.Rate
}
