package lease

// The pool's side of a quota: what holders may have refilled under their
// leases, what the pool takes back, and the shares each lease is sized to.

// accrue brings the lease's bound up to now: the holder may have refilled at
// its reserved rate up to its reserved cap.
func (l *lease) accrue(now int64) {
	if now > l.BoundAt {
		l.Bound = min(l.ResCap, l.Bound+l.ResRate*float64(now-l.BoundAt)/1e6)
		l.BoundAt = now
	}
}

// collapse ends a shrink reservation: the holder can no longer be spending
// under any answer but the latest.
func (l *lease) collapse() {
	l.ResCap, l.ResRate, l.ResUntil = l.Cap, l.Rate, 0
	l.Bound = min(l.Bound, l.ResCap)
}

// refill brings the pool up to now: it refills at r - sum(reserved r_i) up to
// B - sum(reserved b_i). The reservations must not have changed since poolAt;
// every step that changes them refills first.
func (q *quota) refill(now int64) {
	if f := q.fund; (f.Burst > 0 || f.Rate > 0) && now >= f.NotAfter {
		// The upstream lease is over: refill under it up to its end, then
		// drop it. Its tokens still in the pool go (reshape trims to the
		// quota's own part): the upstream holder may not spend them.
		q.refill(max(q.poolAt, f.NotAfter-1))
		q.fund = Funding{}
		q.reshape()
	}
	if now <= q.poolAt {
		return
	}
	dt := now - q.poolAt
	q.poolAt = now
	resCap, resRate := q.reserved()
	room := q.cfg.Burst - resCap
	rate := q.cfg.Rate - resRate
	if room <= q.pool || rate <= 0 {
		return
	}
	q.pool = min(room, q.pool+rate*float64(dt)/1e6)
}

// credit puts tokens a holder gave back into the pool, within its room; what
// does not fit is lost (the tokens' capacity still exists, as the holder's
// own bucket refills). It returns what was credited.
func (q *quota) credit(back float64) float64 {
	if back <= 0 {
		return 0
	}
	resCap, _ := q.reserved()
	c := min(back, max(0, max(0, q.cfg.Burst-resCap)-q.pool))
	q.pool += c
	return c
}

// settle lowers the ceilings towards B and r as reservations shrink. It
// never raises them: a step that reserved more than the ceiling allows is
// caught by CheckInvariants.
func (q *quota) settle() {
	resCap, resRate := q.reserved()
	q.ceilBurst = max(q.cfg.Burst, min(q.ceilBurst, resCap+q.pool))
	q.ceilRate = max(q.cfg.Rate, min(q.ceilRate, resRate))
}

// reserved sums the reserved sizes (agg.go: the same rounding on every
// replica, whatever order the leases came and went in).
func (q *quota) reserved() (capSum, rateSum float64) {
	return q.resSum[0], q.resSum[1]
}

func (q *quota) reservedExcept(x *lease) (capSum, rateSum float64) {
	t := except(q.res, x.nodes[nRes])
	return t[0], t[1]
}

// target is a lease's fair share: what it would get if nothing else were
// reserved beyond the others' own shares.
type target struct{ cap, rate float64 }

// targetList holds the targets of a quota's leases, by position.
type targetList []target

// targeter gives the leases of a quota their targets: from the water
// levels of the aggregates (agg.go), or, when those do not decide them,
// from the full computation (slow, by position).
type targeter struct {
	rate, cap filling
	ratio     float64 // caps are rates * ratio, when r > 0
	slow      targetList
}

// of returns l's target; l must belong to the quota, unchanged since.
func (t targeter) of(l *lease) target { return t.ofAt(l.pos, l) }

func (t targeter) ofAt(i int, l *lease) target {
	if t.slow != nil {
		return t.slow[i]
	}
	r := t.rate.of(l.lim)
	if t.ratio > 0 {
		return target{cap: r * t.ratio, rate: r}
	}
	return target{cap: t.cap.of(l.lim), rate: r}
}

// targets water-fills r and B among the live leases of q (those not expired
// at now, and extra, a lease being granted, which the caller has put in the
// fair share) by demand and weight, then shares what the demands leave
// over by weight (see share). Leases that are not live get a zero target.
// The caller must have taken the expired leases out of the fair share
// (purge) and put extra in. It costs O(log n) in the n leases of q, unless
// the floors alone exceed r (see compute).
func (q *quota) targets(now int64, extra *lease) targeter {
	t := q.compute()
	if t.slow == nil {
		return t
	}
	for i, l := range q.leases {
		l.pos = i
	}
	t.slow = q.share(now, extra)
	return t
}

// compute reads the water levels off the aggregates, which must hold the
// live leases: slow is set (to an empty, non-nil list) when they do not
// decide them, for the caller to fill with share.
func (q *quota) compute() targeter {
	var t targeter
	t.rate = q.fill(q.cfg.Rate, 1)
	if q.cfg.Rate > 0 {
		// Water-filling is scale-invariant: filling B with everything
		// scaled by B/r gives the rate shares scaled by B/r.
		t.ratio = q.cfg.Burst / q.cfg.Rate
	} else {
		t.cap = q.fill(q.cfg.Burst, float64(q.cfg.LeasePeriod)/1e6)
	}
	if t.rate.stage == fillNone || t.ratio == 0 && t.cap.stage == fillNone {
		t.slow = targetList{}
	}
	return t
}

// share computes the targets of q's leases, aligned with q.leases, without
// touching the state (the leader reads it under a read lock).
//
// Rate shares are water-filled by demand and weight within [MinSlice,
// MaxSlice]; what the demands leave over is then water-filled by weight
// alone (each lease up to its MaxSlice), so a quota's whole rate is always
// assigned: a lone holder gets all of it, whatever demand it measured
// before its traffic rose, and a holder whose demand rises finds its share
// already there up to an equal split. Caps get the same proportion of B, by
// scaling demands and slices by B/r (by the lease period when r is 0). The
// leader moves shares towards these targets in round trips (it tells the
// holders above theirs to renew at once), so a newcomer or a rising demand
// is served without waiting for anyone's renew point.
func (q *quota) share(now int64, extra *lease) targetList {
	idx := make([]int, 0, len(q.leases))
	for i, l := range q.leases {
		if l == extra || now <= l.Expiry {
			idx = append(idx, i)
		}
	}
	n := len(idx)
	buf := make([]float64, 5*n)
	d, w, lo, hi, dc := buf[:n], buf[n:2*n], buf[2*n:3*n], buf[3*n:4*n], buf[4*n:]
	maxSlice := q.cfg.MaxSlice
	if maxSlice == 0 {
		maxSlice = 2 * MaxValue // no maximum, but finite for the scaling below
	}
	for i, k := range idx {
		l := q.leases[k]
		d[i], w[i], lo[i], hi[i] = l.Demand, l.Weight, q.cfg.MinSlice, maxSlice
		if b := l.Bounds; b != nil {
			lo[i], hi[i] = b.MinSlice, b.MaxSlice
			if hi[i] == 0 {
				hi[i] = 2 * MaxValue
			}
		}
	}
	rates := fillWithLeftover(q.cfg.Rate, d, w, lo, hi)
	var caps []float64
	if q.cfg.Rate > 0 {
		// Water-filling is scale-invariant: filling B with everything
		// scaled by B/r gives the rate shares scaled by B/r.
		caps = dc
		for i := range idx {
			caps[i] = rates[i] * q.cfg.Burst / q.cfg.Rate
		}
	} else {
		scale := float64(q.cfg.LeasePeriod) / 1e6
		for i := range idx {
			dc[i], lo[i], hi[i] = d[i]*scale, lo[i]*scale, hi[i]*scale
		}
		caps = fillWithLeftover(q.cfg.Burst, dc, w, lo, hi)
	}
	out := make(targetList, len(q.leases))
	for i, k := range idx {
		out[k] = target{cap: caps[i], rate: rates[i]}
	}
	return out
}

// fillWithLeftover water-fills capacity by demand (FairShare), then, when
// the demands leave some over, water-fills it by weight alone on top of
// those shares, each up to its maximum: the result is still a weighted
// max-min fair division, of every holder's demand raised to its maximum,
// with the floors its demand share set.
func fillWithLeftover(capacity float64, d, w, lo, hi []float64) []float64 {
	shares := FairShare(capacity, d, w, lo, hi)
	var sum float64
	for _, s := range shares {
		sum += s
	}
	if !(capacity-sum > 0) || len(shares) == 0 {
		return shares
	}
	return FairShare(capacity, hi, w, shares, hi)
}
