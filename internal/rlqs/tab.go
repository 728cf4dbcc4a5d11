package rlqs

// A tab is the account of one Envoy bucket's assignments that one lease
// funds: what was lent for them (tokens and a refill rate), what Envoy
// reported, and what can go back. It is pure bookkeeping (times in
// microseconds on the holder's clock, no I/O); the stream (server.go)
// applies its moves to the lease.
//
// # What Envoy can spend
//
// Envoy's filter (source/extensions/filters/http/rate_limit_quota,
// global_client_impl.cc) applies the latest assignment it received for a
// bucket from its receipt until its TTL runs out or the next action for
// the bucket arrives, whichever is first. A token bucket assignment
// {max_tokens M, tokens_per_fill f, fill_interval 1s, TTL t} either starts a
// new bucket, full, or carries on the previous bucket of identical sizes;
// either way its level is at most M, and it refills at f per second while
// it applies. An assignment sent at s, received at r >= s, applies within
//
//	[s, end),  end = min(s + t + delta, s' + delta)
//
// where s' is when the next action for the bucket was sent, and delta bounds
// the delivery of a message plus the lateness of Envoy's timers (the same
// kind of assumption as the holder's pause bound m): it is received by
// s + delta and expires by r + t. end starts at s + t + delta, as if never
// replaced, and falls when a successor is sent (cut). At any moment Envoy's
// bucket refills under one assignment at most, at no more than the largest
// f of the assignments whose [s, end) holds that moment, and holds at most
// the M of the one that applies.
//
// # What the lease lends
//
// The lease and its Envoys form one token bucket of the lease's cap and
// rate, which is the lease's contract (lease.Holding):
//
//   - Tokens: each assignment's M is lent when it is sent
//     (lease.Holding.Lend): it leaves the balance and stays counted in
//     Lent, against the cap, until the tab repays it. So the balance plus
//     what Envoy holds (at most the M of an assignment still lent) never
//     exceed the cap. (Tokens merely taken out of the balance would let it
//     refill behind them; spent later by Envoy they would exceed the cap.)
//   - Rate: the tab holds, lent from the lease's refill, at least the
//     largest f of its assignments whose end is still ahead (rate: a new
//     assignment's f is lent before it is sent, superseding what the tab
//     holds, see Holding.Lend's held; what exceeds the need is repaid once
//     the ends that needed it have passed, which settle notices). The lease
//     refills at Rate - LentRate, so the lease and its Envoys together
//     refill at most at Rate.
//
// Each assignment ends before the lease's ValidUntil (plan.go, fit), so
// Envoy never admits, nor refills, under a lease after the holder may no
// longer spend it; a lease whose rate shrinks below what is lent does not
// confirm it until the loans end, so the coordinator keeps the older,
// larger rate reserved meanwhile.
//
// # What comes back
//
// Rate comes back by itself: once an end has passed, Envoy refills under
// that assignment no more. Tokens come back only as far as they provably
// were never spent. An assignment is settled once it is over and Envoy has
// told everything it did under it: a report received at rho was sent
// after rho - delta, so a report received at or after end + delta counts
// every admission under it (reports arrive in order on the stream and each
// counts the admissions since the previous one). Let S be the M of the
// settled assignments (since the tab last held nothing) and U every allowed
// request reported since then. Envoy's bucket took in at most S tokens
// from those assignments (one fill of at most M each, or none when it
// carried on) plus its refill; every admission, funded by either, is in
// U; so at least S - U of the lent tokens were never spent, and they can
// no longer be (the assignments are over). The tab gives back S - U less
// what it gave back already (never less than 0), and the rest of the M is
// gone. Refill is never given back: a bucket that sat full lost it, so
// what it would have given is no lower bound of what is left. U may count
// admissions that no assignment of this tab funded (Envoy's own
// no_assignment or expired fallbacks, or an unfunded ALLOW_ALL): that
// only lowers what comes back. The price: an Envoy that spends its refill
// under a stream of assignments is charged each one's M too, so the
// server re-sends an assignment only when it must (server.go, renewDue).
//
// When the tab holds no assignment any more, S, U and what was given back
// start again from 0: every admission of an earlier assignment is in a
// report received before (the closing one), and a later report counts only
// admissions after it was sent, so no later report counts them.
//
// An assignment no report closes (Envoy stopped reporting, or the stream
// ended) is forfeit once it is over and a grace for its report has passed
// (at once once the stream ended): its M is repaid with nothing given
// back. A report that still counts its admissions afterwards only lowers
// what later comes back.
//
// So: what goes back to the balance is never more than what Envoy can no
// longer spend and did not spend, what stays lent is never less than what
// Envoy may still hold, and the rate the tab holds is never less than what
// Envoy may still refill at. internal/rlqs/tab_test.go checks all three
// against an Envoy that receives and reports as late as delta allows,
// restarts its bucket full on every assignment and spends everything it
// may.
type tab struct {
	delta int64 // delivery and timer margin
	grace int64 // how long after end+delta a report may be awaited
	as    []assignment
	// since the tab last held nothing:
	settled float64 // S: caps of settled assignments
	used    float64 // U: allowed requests reported
	back    float64 // given back by settling
	lent    float64 // M of the assignments in as
	rate    float64 // refill rate lent for them (see need)
	last    int64   // when the last report arrived (-1: none since reset)
	closed  bool    // no report will come (the stream ended)
}

// assignment is one token bucket assignment sent for the bucket; cap is
// the tokens lent for it (M).
type assignment struct {
	sent, end   int64
	expires     int64 // sent + TTL: Envoy holds it at least until then
	burst, rate float64
	cap         float64
	// carried: Envoy carries on the previous assignment's bucket under it
	// (see carries); its cap is the previous one's, moved, not lent anew.
	carried bool
}

// move is what a tab step asks of the lease: lend tokens and rate (before
// sending an assignment; held is the rate the tab held, which the loan
// supersedes), or repay lent tokens, back of them to the balance, and
// lent rate.
type move struct {
	lend, lendRate, held float64
	repay, repayRate     float64
	back                 float64
}

func newTab(delta, grace int64) *tab { return &tab{delta: delta, grace: grace, last: -1} }

// cut records that an action for the bucket (an assignment of any kind,
// or an abandon) was sent at now: the last assignment ends by now + delta.
// No tokens come back at once (its M may still be held), nor its rate,
// needed until that end; what earlier ends no longer need does.
func (t *tab) cut(now int64) move {
	if len(t.as) > 0 {
		a := &t.as[len(t.as)-1]
		a.end = min(a.end, now+t.delta)
	}
	return move{repayRate: t.release(now)}
}

// need is the rate Envoy may still refill at after now: the largest of the
// assignments whose end is after now.
func (t *tab) need(now int64) float64 {
	var r float64
	for _, a := range t.as {
		if a.end > now {
			r = max(r, a.rate)
		}
	}
	return r
}

// release repays the rate the tab holds beyond what it needs after now.
func (t *tab) release(now int64) float64 {
	d := max(0, t.rate-t.need(now))
	t.rate -= d
	return d
}

// assign records a token bucket assignment {burst, rate per second, ttl}
// sent at now, after cutting the previous one, and returns the moves: the
// cut's (and any rate no longer needed) and the new assignment's loan: its
// M, and the rate it needs beyond what the tab holds (held). With carry
// (the caller's word that the last action sent for the bucket is the
// tab's last assignment, of the same sizes and fill interval) and when
// carries agrees, the new assignment lends no tokens: Envoy keeps the
// bucket it has (see carries).
func (t *tab) assign(now int64, burst, rate float64, ttl int64, carry bool) (cutMove, loan move) {
	carry = carry && t.carries(now, burst, rate)
	cutMove = t.cut(now)
	if len(t.as) == 0 {
		t.reset()
	}
	a := assignment{sent: now, end: now + ttl + t.delta, expires: now + ttl, burst: burst, rate: rate, cap: burst}
	loan = move{lend: a.cap, lendRate: rate, held: t.rate}
	if carry {
		prev := &t.as[len(t.as)-1]
		a.cap, prev.cap, a.carried = prev.cap, 0, true
		loan.lend = 0
	} else {
		t.lent += a.cap
	}
	t.as = append(t.as, a)
	t.rate = max(t.rate, rate)
	return cutMove, loan
}

// carries says whether an assignment of burst and rate sent at now is
// taken by Envoy as the one it holds, carried on: the tab's last
// assignment has those sizes and its whole M lent, and Envoy still holds
// it when the new one arrives (by now + delta, before its TTL from its
// send ends). Envoy then keeps its bucket, level and all (it replaces a
// bucket only when max_tokens, tokens_per_fill or the interval's nanos
// differ, or when none is held), so nothing is filled: the M lent for the
// last assignment goes on covering what Envoy holds, and S (see above)
// counts one fill for the chain, as Envoy took one. Envoys that start a
// new bucket on every assignment are the caller's to rule out (Options.
// Carry).
func (t *tab) carries(now int64, burst, rate float64) bool {
	if len(t.as) == 0 {
		return false
	}
	prev := t.as[len(t.as)-1]
	return prev.burst == burst && prev.rate == rate && prev.cap == burst && now+t.delta < prev.expires
}

// unassign takes back the last assignment when its loan could not be made
// or it was never sent: nothing of it can be spent. It returns the tokens
// its loan lent and the rate the tab no longer needs for it. A carried
// assignment gives its cap back to the one it carried on.
func (t *tab) unassign() (tokens, rate float64) {
	n := len(t.as) - 1
	a := t.as[n]
	t.as = t.as[:n]
	if a.carried {
		t.as[n-1].cap = a.cap
		return 0, t.release(a.sent)
	}
	t.lent -= a.cap
	return a.cap, t.release(a.sent)
}

// report records allowed requests reported at now, then settles.
func (t *tab) report(now int64, allowed float64) move {
	if len(t.as) == 0 {
		// Nothing outstanding: these admissions are of settled or
		// forfeit assignments, or unfunded (see reset).
		return move{}
	}
	t.used += allowed
	t.last = now
	return t.settle(now)
}

// settle settles or forfeits the assignments that are over at now.
func (t *tab) settle(now int64) move {
	m := move{repayRate: t.release(now)}
	n := 0
	for _, a := range t.as {
		switch {
		case t.last >= 0 && t.last >= a.end+t.delta:
			t.settled += a.cap
			m.repay += a.cap
		case now >= a.end && (t.closed || now >= a.end+t.delta+t.grace):
			m.repay += a.cap // forfeit: not provably unspent
		default:
			goto done
		}
		n++
	}
done:
	if n == 0 {
		return m
	}
	t.as = t.as[n:]
	t.lent -= m.repay
	if give := t.settled - t.used - t.back; give > 0 {
		m.back = min(give, m.repay)
		t.back += m.back
	}
	if len(t.as) == 0 {
		t.reset()
	}
	return m
}

// close records that no report will come: what is over is forfeit.
func (t *tab) close(now int64) move {
	t.closed = true
	return t.settle(now)
}

// reset starts S, U and what was given back again from 0 (see the
// argument above); only while the tab holds no assignment.
func (t *tab) reset() {
	// t.rate is not reset: rate is repaid as ends pass (release), and
	// with no assignment left none is needed.
	t.settled, t.used, t.back, t.lent, t.last = 0, 0, 0, 0, -1
}

// empty reports whether nothing is lent any more.
func (t *tab) empty() bool { return len(t.as) == 0 && t.rate == 0 }

// next is when settle may next have work without a report: the first
// assignment's forfeit time (-1: none).
func (t *tab) next() int64 {
	if len(t.as) == 0 {
		return -1
	}
	if t.closed {
		return t.as[0].end
	}
	return t.as[0].end + t.delta + t.grace
}

// lower shrinks the last assignment, not sent yet, to smaller sizes (a
// bucket funded by several leases gets the smallest of their plans): the
// difference of tokens and rate goes back at once.
func (t *tab) lower(burst, rate float64, ttl int64) move {
	a := &t.as[len(t.as)-1]
	d := max(0, a.cap-burst)
	a.burst, a.rate, a.end, a.cap = min(a.burst, burst), min(a.rate, rate), min(a.end, a.sent+ttl+t.delta), a.cap-d
	t.lent -= d
	return move{repay: d, back: d, repayRate: t.release(a.sent)}
}
