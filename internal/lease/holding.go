package lease

import "math"

// Holding is the holder's half of one lease: the local bucket an agent
// spends from, and the bookkeeping that its side of the contract needs.
// Conservation holds only if holders keep these rules, which Holding
// implements:
//
//   - Spend only while the lease is valid: until the term (less clock drift
//     and the longest pause, see Validity) has passed since the request that
//     obtained it was SENT, on the holder's monotonic clock.
//   - Refill at the adopted Rate, never above the adopted Cap.
//   - Tokens put in a renewal's Unused, or a release's, are taken out of the
//     bucket when the command is sent and never spent, whatever the answer.
//   - Adopt only the answer to the latest command sent for this lease, and
//     only once: an answer to an older one (late, or overtaken by a retry
//     with a newer Seq) is ignored, so a confirmation is never undone, and
//     a second copy of an answer (the replay a retry gets) does not add its
//     tokens twice.
//   - On a shrink, the excess over the new cap is not spent: it is owed, and
//     given back at the next renewal or release.
//   - Tokens lent to a delegate that spends them later (Lend: an Envoy
//     RLQS assignment) still count in the bucket's level until the holder
//     knows the delegate can no longer spend them (Repay): the bucket
//     refills only up to Cap - Lent, a shrink that leaves less than Lent
//     is not confirmed until the loans are repaid, and a lease with
//     loans outstanding is never released (it expires instead). Taken
//     out of the balance, lent tokens would let the bucket refill behind
//     them, and the delegate spending them later would hold more than
//     the cap the coordinator reserved.
//   - A refill rate lent to a delegate (Lend's rate: an Envoy assignment's
//     tokens_per_fill) is taken out of the bucket's own refill, which runs
//     at Rate - LentRate, until the holder knows the delegate refills under
//     it no more (Repay): the bucket and its delegates together refill at
//     no more than Rate. A loan's rate must fit in the adopted Rate beside
//     the others', and a renewal that lowers Rate below LentRate is not
//     confirmed until the loans end (as for the cap).
//
// Times are the holder's monotonic clock in microseconds. A Holding is not
// safe for concurrent use.
type Holding struct {
	Quota string
	// Lease is the latest adopted answer (zero before the first).
	Lease Lease
	// Balance is the spendable tokens, as of the last call.
	Balance float64
	// Owed is what a shrink left above the cap, to give back.
	Owed float64
	// Lent is what delegates may still spend of what was lent to them
	// (Lend, Repay); it counts against the cap like the balance.
	Lent float64
	// LentRate is the refill rate delegates may still refill at (Lend,
	// Repay); the bucket's own refill runs at Rate - LentRate.
	LentRate float64
	// ValidUntil is when spending stops, on the holder's clock.
	ValidUntil int64
	// Validity turns a term into how long after sending the holder may
	// spend; nil means the whole term (see AgentValidity).
	Validity func(term int64) int64

	at      int64  // Balance is as of at
	sentSeq uint64 // the latest command sent for this lease
	sentAt  int64
	adopted uint64 // the seq whose answer was adopted last
}

// AgentValidity is how long after sending its request a holder may spend a
// lease of the given term: D(1-rho)/(1+rho) - m, with rho the clock-rate
// drift bound and m the longest pause between a validity check and an
// admission. Never negative.
func AgentValidity(term int64, drift float64, pause int64) int64 {
	if !(drift >= 0) || drift >= 1 {
		return 0
	}
	return max(0, int64(math.Floor(float64(term)*(1-drift)/(1+drift)))-pause)
}

// Grant builds a grant (the leader stamps Now) and remembers it was sent.
func (h *Holding) Grant(now int64, holder string, seq uint64, demand float64) Grant {
	h.sent(now, seq)
	return Grant{Holder: holder, Seq: seq, Quota: h.Quota, Demand: demand}
}

// Renewal builds this lease's item of a Renew sent at now with seq. It gives
// back what is owed plus up to surrender spendable tokens, and confirms the
// sizes the holder spends under.
func (h *Holding) Renewal(now int64, seq uint64, demand, surrender float64) RenewItem {
	h.refill(now)
	give := min(max(surrender, 0), h.Balance)
	h.Balance -= give
	give += h.Owed
	h.Owed = 0
	h.sent(now, seq)
	confirmed := h.Lease.Cap
	if h.Lent > h.Lease.Cap {
		// Loans made under the old, larger cap are still out: confirming
		// would let the coordinator reserve less than they hold. Not
		// confirmed, the old cap stays reserved until the old term is
		// over, and so are the loans made under it.
		confirmed = h.Lent
	}
	rate := h.Lease.Rate
	if h.LentRate > rate {
		// The same for a rate lent under an older, larger one: its loans
		// end before the older term does, which stays reserved meanwhile.
		rate = h.LentRate
	}
	return RenewItem{
		LeaseID: h.Lease.ID, Quota: h.Quota, Unused: give, Demand: demand,
		ConfirmedCap: confirmed, ConfirmedRate: rate,
	}
}

// Release builds a release of this lease and stops spending it. An expired
// lease's tokens are not reported: they are forfeit.
// A lease with loans out (Lent or LentRate > 0) must not be released: its delegates
// may still spend them, and a release ends every reservation of it.
func (h *Holding) Release(now int64, holder string, seq uint64) Release {
	h.refill(now)
	var unused float64
	if h.Valid(now) {
		unused = h.Balance + h.Owed
	}
	h.Balance, h.Owed, h.ValidUntil = 0, 0, min(h.ValidUntil, now)
	h.sent(now, seq)
	return Release{Holder: holder, Seq: seq, LeaseID: h.Lease.ID, Unused: unused}
}

// Adopt takes an answer (a grant's lease or a renewal item's) received at
// now for the command sent with seq. It reports false, and changes nothing,
// for an answer to anything but the latest command sent for this lease, or
// one already adopted.
func (h *Holding) Adopt(now int64, seq uint64, l Lease) bool {
	if seq != h.sentSeq || seq == h.adopted || l.Quota != h.Quota {
		return false
	}
	h.adopted = seq
	h.refill(now)
	if !h.Valid(now) {
		h.Balance, h.Owed = 0, 0 // an expired term's tokens are forfeit
	}
	h.Lease = l
	h.Balance += l.Balance
	if room := max(0, l.Cap-h.Lent); h.Balance > room {
		h.Owed += h.Balance - room
		h.Balance = room
	}
	d := l.Term
	if h.Validity != nil {
		d = h.Validity(l.Term)
	}
	h.ValidUntil = h.sentAt + d
	return true
}

// Drop forgets the lease (after ErrLeaseExpired): nothing may be spent until
// a new grant is adopted.
func (h *Holding) Drop() {
	// The coordinator answers "expired" only once the lease's term is over
	// on every clock: no loan of it can still be spent.
	h.Lease, h.Balance, h.Owed, h.Lent, h.LentRate, h.ValidUntil = Lease{}, 0, 0, 0, 0, 0
}

// Lend takes amount tokens at now out of the balance, and rate out of the
// bucket's own refill, for a delegate that may spend them later (only
// before ValidUntil: the caller bounds that), and counts them in Lent and
// LentRate. held is rate lent before to the same delegate for what this
// loan supersedes: the delegate refills under one of them at a time, so
// the two need only the larger until the superseded loan ends (its lender
// repays the difference then), and the lease's Rate must cover what stays
// lent after that, LentRate - held + rate. It reports false, and changes
// nothing, if the lease is not valid or does not hold them.
func (h *Holding) Lend(now int64, amount, rate, held float64) bool {
	if !h.Valid(now) || !(amount >= 0) || !(rate >= 0) || !(held >= 0) || !(amount > 0 || rate > 0) {
		return false
	}
	h.refill(now)
	if h.Balance < amount || h.LentRate-min(held, h.LentRate)+rate > h.Lease.Rate+1e-9 {
		return false
	}
	h.Balance -= amount
	h.Lent += amount
	h.LentRate += max(0, rate-held)
	return true
}

// Repay ends lent tokens and rate of a loan at now: the delegate can no
// longer spend those tokens nor refill at that rate. back of the tokens
// (at most lent) were provably never spent and return to the balance
// while the lease is valid (within the cap); the rest were spent, or may
// have been, and are gone. The rate returns to the bucket's own refill.
func (h *Holding) Repay(now int64, lent, rate, back float64) {
	if !(lent > 0) && !(rate > 0) {
		return
	}
	h.refill(now)
	if rate > 0 {
		h.LentRate = max(0, h.LentRate-rate)
	}
	if !(lent > 0) {
		return
	}
	h.Lent = max(0, h.Lent-lent)
	if back = min(back, lent); back > 0 && h.Valid(now) {
		h.Balance = min(max(0, h.Lease.Cap-h.Lent), h.Balance+back)
	}
}

// AvailableRate reports the refill rate that may be lent at now: the
// adopted Rate less what is lent, or 0 when the lease is not valid.
func (h *Holding) AvailableRate(now int64) float64 {
	if !h.Valid(now) {
		return 0
	}
	return max(0, h.Lease.Rate-h.LentRate)
}

// Available reports the tokens that may be spent at now: the balance
// refilled to now, or 0 when the lease is not valid.
func (h *Holding) Available(now int64) float64 {
	if !h.Valid(now) {
		return 0
	}
	h.refill(now)
	return h.Balance
}

// Valid reports whether the lease may be spent at now.
func (h *Holding) Valid(now int64) bool { return h.Lease.ID != 0 && now < h.ValidUntil }

// Spend takes cost tokens at now if the lease is valid and holds them.
func (h *Holding) Spend(now int64, cost float64) bool {
	if !h.Valid(now) || !(cost > 0) {
		return false
	}
	h.refill(now)
	if h.Balance < cost {
		return false
	}
	h.Balance -= cost
	return true
}

func (h *Holding) sent(now int64, seq uint64) { h.sentSeq, h.sentAt = seq, now }

// refill adds what the adopted rate less the lent rate gave since the last
// call, up to the cap less what is lent, and not past the lease's validity.
func (h *Holding) refill(now int64) {
	end := min(now, h.ValidUntil)
	if room := h.Lease.Cap - h.Lent; end > h.at && h.Balance < room {
		h.Balance = min(room, h.Balance+max(0, h.Lease.Rate-h.LentRate)*float64(end-h.at)/1e6)
	}
	h.at = max(h.at, now)
}
