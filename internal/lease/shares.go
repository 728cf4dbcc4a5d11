package lease

// Share is one live lease next to its fair share: what a leader reads to
// decide which holders to tell to renew at once (the coordinator's nudges).
// Reading it changes nothing.
type Share struct {
	Holder string
	// Cap and Rate are the latest answer's sizes; ResCap and ResRate what is
	// still reserved (larger while a shrink is unconfirmed).
	Cap, Rate       float64
	ResCap, ResRate float64
	// TargetCap and TargetRate are the fair share the next renewal would
	// move the lease towards, as the quota stands now.
	TargetCap, TargetRate float64
	Demand                float64
}

// Shares returns the quota's live leases (not expired at the state's clock)
// with their fair shares (of the own part alone, for a funded quota handing
// over, see handover.go), in the state's order, and what the quota has
// free: its capacity and rate less every reservation (negative while it is
// over-committed, after its capacity fell), and the pool's tokens (as of
// its last refill). ok is false for an unknown quota.
func (s *State) Shares(quota string) (shares []Share, freeCap, freeRate, pool float64, ok bool) {
	q := s.quotas[quota]
	if q == nil {
		return nil, 0, 0, 0, false
	}
	// The aggregates hold the live leases unless some expired since the
	// quota's last step (taking them out would write to the state).
	var t targeter
	if q.fresh(s.now) {
		t = q.compute()
	}
	if !q.fresh(s.now) || t.slow != nil {
		t.slow = q.share(s.now, nil)
	}
	shares = make([]Share, 0, len(q.leases))
	for i, l := range q.leases {
		if s.now > l.Expiry {
			continue
		}
		tg := t.ofAt(i, l)
		if q.handingOver(s.now, l.period(q)) {
			// Its renewal is answered out of the own part (handover.go).
			tg = q.handOverShare(tg)
		}
		shares = append(shares, Share{
			Holder: l.Holder, Cap: l.Cap, Rate: l.Rate, ResCap: l.ResCap, ResRate: l.ResRate,
			TargetCap: tg.cap, TargetRate: tg.rate, Demand: l.Demand,
		})
	}
	resCap, resRate := q.reserved()
	return shares, q.cfg.Burst - resCap, q.cfg.Rate - resRate, q.pool, true
}

// LiveLeases reports how many of the quota's leases are not expired at the
// state's clock: a cheap test before Shares.
func (s *State) LiveLeases(quota string) int {
	q := s.quotas[quota]
	if q == nil {
		return 0
	}
	if q.fresh(s.now) {
		if q.live == nil {
			return 0
		}
		return q.live.n
	}
	n := 0
	for _, l := range q.leases {
		if s.now <= l.Expiry {
			n++
		}
	}
	return n
}
