package rlqs

// A tab is the account of one Envoy bucket's assignments that one lease
// funds: what was lent for them, what Envoy reported, and what can go back.
// It is pure bookkeeping (times in microseconds on the holder's clock, no
// I/O); the stream (stream.go) applies its moves to the lease.
//
// # What Envoy can spend
//
// Envoy's filter (source/extensions/filters/http/rate_limit_quota,
// global_client_impl.cc) applies the latest assignment it received for a
// bucket from its receipt until its TTL runs out or the next action for
// the bucket arrives, whichever is first. A token bucket assignment
// {max_tokens M, tokens_per_fill, fill_interval 1s, TTL t} either starts a
// new bucket, full, or carries on the previous bucket of identical sizes;
// either way its level at receipt is at most M and it refills at
// f = tokens_per_fill per second. So an assignment sent at s, received at
// r >= s, admits at most
//
//	M + f*(end - s),  end = min(s + t + delta, s' + delta)
//
// where s' is when the next action for the bucket was sent, and delta bounds
// the delivery of a message plus the lateness of Envoy's timers (the same
// kind of assumption as the holder's pause bound m): the assignment is
// received by s + delta and expires by r + t. That number is the
// assignment's cap; it starts at M + f*t + f*delta, as if never replaced,
// and falls when a successor is sent (cut). Envoy's count of admissions
// ever made under the tab's assignments is therefore at most the sum of
// their caps, and what it may still admit after time now is at most the sum
// of the caps of the assignments whose end is after now.
//
// # What the lease lends
//
// Each assignment's cap is lent from the lease when it is sent
// (lease.Holding.Lend): it stays counted against the lease's cap until the
// tab repays it, so the lease plus Envoy never hold more than the cap the
// coordinator reserved, and Envoy's spending is paid for before it happens.
// (Lent tokens merely taken out of the balance would let the balance refill
// behind them; spent later by Envoy they would exceed the cap.) The
// assignment's TTL is chosen so that end < the lease's ValidUntil (server
// sizing), so Envoy never admits under a lease after the holder may no
// longer spend it.
//
// # What comes back
//
// A cut lowers an assignment's cap: the difference can never be spent and
// is repaid into the balance at once. Otherwise an assignment is settled
// once it is over and Envoy has told everything it did under it: a report
// received at rho was sent after rho - delta, so a report received at or
// after end + delta counts every admission under the assignment (reports
// arrive in order on the stream and each counts the admissions since the
// previous one). Let S be the caps of the settled assignments (since the
// tab last held nothing) and U every allowed request reported since then.
// The settled assignments' admissions are all in U, so at least S - U of
// their tokens were never spent; the tab gives back S - U less what it gave
// back already (never less than 0), and the rest of their caps is gone
// (spent, or not provably unspent). U may count admissions that no
// assignment of this tab funded (Envoy's own no_assignment or expired
// fallbacks, or an unfunded ALLOW_ALL): that only lowers what comes back.
//
// When the tab holds no assignment any more, S, U and what was given back
// start again from 0: every admission of an earlier assignment is in a
// report received before (the closing one), and a later report counts only
// admissions after it was sent, so no later report counts them.
//
// An assignment no report closes (Envoy stopped reporting, or the stream
// ended) is forfeit once it is over and a grace for its report has passed
// (at once once the stream ended): its cap is repaid with nothing given
// back. A report that still counts its admissions afterwards only lowers
// what later comes back.
//
// So: what goes back to the balance is never more than what Envoy can no
// longer spend and did not spend, and what stays lent is never less than
// what Envoy may still spend. internal/rlqs/tab_test.go checks both against
// an Envoy that receives and reports as late as delta allows, restarts its
// bucket full on every assignment and spends everything it may.
type tab struct {
	delta int64 // delivery and timer margin
	grace int64 // how long after end+delta a report may be awaited
	as    []assignment
	// since the tab last held nothing:
	settled float64 // S: caps of settled assignments
	used    float64 // U: allowed requests reported
	back    float64 // given back by settling
	lent    float64 // caps of the assignments in as
	last    int64   // when the last report arrived (-1: none since reset)
	closed  bool    // no report will come (the stream ended)
}

// assignment is one token bucket assignment sent for the bucket.
type assignment struct {
	sent, end   int64
	burst, rate float64
	cap         float64
}

// move is what a tab step asks of the lease: lend tokens (before sending
// an assignment), or repay lent tokens, back of them to the balance.
type move struct {
	lend, repay, back float64
}

func newTab(delta, grace int64) *tab { return &tab{delta: delta, grace: grace, last: -1} }

// capOf is an assignment's cap if it ends at end.
func capOf(burst, rate float64, sent, end int64) float64 {
	return burst + rate*float64(max(0, end-sent))/1e6
}

// cut records that an action for the bucket (an assignment of any kind,
// or an abandon) was sent at now: the last assignment ends by now + delta.
func (t *tab) cut(now int64) move {
	if len(t.as) == 0 {
		return move{}
	}
	a := &t.as[len(t.as)-1]
	end := now + t.delta
	if end >= a.end {
		return move{}
	}
	c := capOf(a.burst, a.rate, a.sent, end)
	d := max(0, a.cap-c)
	a.end, a.cap = end, min(a.cap, c)
	t.lent -= d
	return move{repay: d, back: d}
}

// assign records a token bucket assignment {burst, rate per second, ttl}
// sent at now, after cutting the previous one, and returns the moves: the
// cut's repayment and the new assignment's loan (its cap).
func (t *tab) assign(now int64, burst, rate float64, ttl int64) (cutMove, loan move) {
	cutMove = t.cut(now)
	if len(t.as) == 0 {
		t.reset()
	}
	end := now + ttl + t.delta
	a := assignment{sent: now, end: end, burst: burst, rate: rate, cap: capOf(burst, rate, now, end)}
	t.as = append(t.as, a)
	t.lent += a.cap
	return cutMove, move{lend: a.cap}
}

// unassign takes back the last assignment when its loan could not be made
// or it was never sent: nothing of it can be spent.
func (t *tab) unassign() {
	n := len(t.as) - 1
	t.lent -= t.as[n].cap
	t.as = t.as[:n]
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
	var m move
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
		return move{}
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
	t.settled, t.used, t.back, t.lent, t.last = 0, 0, 0, 0, -1
}

// empty reports whether nothing is lent any more.
func (t *tab) empty() bool { return len(t.as) == 0 }

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
// difference goes back at once.
func (t *tab) lower(burst, rate float64, ttl int64) move {
	a := &t.as[len(t.as)-1]
	end := min(a.end, a.sent+ttl+t.delta)
	c := capOf(burst, rate, a.sent, end)
	d := max(0, a.cap-c)
	a.burst, a.rate, a.end, a.cap = min(a.burst, burst), min(a.rate, rate), end, a.cap-d
	t.lent -= d
	return move{repay: d, back: d}
}
