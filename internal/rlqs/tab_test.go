package rlqs

import (
	"testing"

	"pgregory.net/rapid"
)

// envoyModel is an adversarial Envoy for one bucket: it receives each
// action as late as delta allows (or earlier, as drawn), starts a full
// bucket on every assignment, admits everything its assignment allows at
// the moments it chooses (always before losing it), admits unfunded
// requests while it has no assignment, and reports whenever it likes,
// its reports arriving up to delta late.
type envoyModel struct {
	inflight []action // sent, not received
	active   *action
	level    float64
	updated  int64
	unrep    float64 // allowed since the last report sent
	fills    float64 // tokens its buckets started with: each a full max_tokens
	reports  []report
}

type action struct {
	sent, ttl   int64
	burst, rate float64
	deny        bool // a DENY_ALL or abandon: nothing admitted
	// carry: sent as the tab's carried assignment: Envoy keeps its bucket
	// if the one it holds has these sizes and has not expired (as
	// Envoy's filter does); any other assignment starts a full bucket.
	carry bool
	recv  int64
	idx   int // the how-manieth action sent

}

type report struct {
	sent    int64
	allowed float64
}

// spend admits everything the active assignment allows up to at, and
// returns the tokens admitted.
func (e *envoyModel) spend(at int64) float64 {
	a := e.active
	if a == nil || a.deny {
		return 0
	}
	until := min(at, a.recv+a.ttl)
	if until > e.updated {
		e.level = min(a.burst, e.level+a.rate*float64(until-e.updated)/1e6)
		e.updated = until
	}
	n := e.level
	e.level = 0
	e.unrep += n
	return n
}

// receive applies the first action in flight at at.
func (e *envoyModel) receive(at int64) (spent float64) {
	a := e.inflight[0]
	e.inflight = e.inflight[1:]
	spent = e.spend(at) // everything the old assignment still allows, first
	a.recv = at
	old := e.active
	if a.carry && old != nil && !old.deny && old.recv+old.ttl > at && old.burst == a.burst && old.rate == a.rate {
		e.active = &a // the same bucket, its level as spend left it
		return spent
	}
	e.active, e.level, e.updated = &a, a.burst, at
	if !a.deny {
		e.fills += a.burst
	}
	return spent
}

func TestTabConservesAgainstAdversarialEnvoy(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		const delta, grace = 100_000, 300_000
		tb := newTab(delta, grace)
		var e envoyModel
		var now int64
		var reserved, back, funded, lentModel, rateModel float64
		// refilled is the integral of the rate the tab held: what Envoy
		// may have refilled beside the tokens lent.
		var refilled float64
		advance := func(dt int64) {
			refilled += tb.rate * float64(dt) / 1e6
			now += dt
		}
		type snap struct {
			seq, sent int
			lent      float64
			refilled  float64
		}
		var snaps []snap
		type use struct {
			seq, idx int
			n        float64
		}
		sent := 0
		var lastTB *action // the last action sent, if a token bucket
		var uses []use
		seq := 0
		closed := false
		carried := 0 // assignments the tab carried on (lent nothing for)
		apply := func(m move) {
			reserved += m.lend
			lentModel += m.lend - m.repay
			rateModel += max(0, m.lendRate-m.held) - m.repayRate
			back += m.back
			if m.back > m.repay+1e-9 || m.repay < -1e-9 || m.lend < 0 || m.lendRate < 0 || m.repayRate < -1e-9 {
				rt.Fatalf("bad move %+v", m)
			}
			if m.lendRate > 0 && m.held > rateModel-max(0, m.lendRate-m.held)+1e-9 {
				rt.Fatalf("loan supersedes rate %v, the tab held %v", m.held, rateModel)
			}
		}
		// envoyRate is the largest rate Envoy may refill at from now on,
		// under its assignment or one in flight.
		envoyRate := func() float64 {
			var r float64
			if a := e.active; a != nil && !a.deny && a.recv+a.ttl > now {
				r = a.rate
			}
			for _, a := range e.inflight {
				if !a.deny {
					r = max(r, a.rate)
				}
			}
			return r
		}
		spend := func(n float64, idx int) {
			if n > 0 {
				funded += n
				uses = append(uses, use{seq, idx, n})
			}
		}
		activeIdx := func() int {
			if e.active == nil {
				return -1
			}
			return e.active.idx
		}
		// deliver forces what must have arrived by now.
		deliver := func(force bool) {
			for len(e.inflight) > 0 && (!force || e.inflight[0].sent+delta <= now) {
				at := max(now, e.inflight[0].sent)
				if force {
					at = e.inflight[0].sent + delta
				}
				seq++
				idx := activeIdx()
				spend(e.receive(at), idx)
				if !force {
					return
				}
			}
			// The active assignment expires: spend what it allows first.
			if a := e.active; a != nil && a.recv+a.ttl <= now {
				seq++
				spend(e.spend(a.recv+a.ttl), a.idx)
				e.active = nil
			}
		}
		deliverReport := func(force bool) {
			for len(e.reports) > 0 && (!force || e.reports[0].sent+delta <= now) {
				r := e.reports[0]
				e.reports = e.reports[1:]
				if !closed {
					at := now
					if force {
						at = r.sent + delta
					}
					apply(tb.report(at, r.allowed))
				}
				if !force {
					return
				}
			}
		}
		steps := rapid.IntRange(1, 120).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			switch rapid.IntRange(0, 8).Draw(rt, "op") {
			case 0: // time passes
				dt := rapid.Int64Range(0, 400_000).Draw(rt, "dt")
				if rapid.IntRange(0, 3).Draw(rt, "long") == 0 {
					dt *= 8 // past a TTL: an assignment expires at Envoy
				}
				advance(dt)
				deliver(true)
				deliverReport(true)
				apply(tb.settle(now))
			case 1: // a token bucket assignment
				if closed {
					continue
				}
				burst := float64(rapid.IntRange(1, 20).Draw(rt, "burst"))
				rate := float64(rapid.IntRange(1, 20).Draw(rt, "rate")) / float64(rapid.IntRange(1, 3).Draw(rt, "interval"))
				ttl := int64(rapid.IntRange(1, 3).Draw(rt, "ttl")) * 1_000_000
				// Sent again unchanged, after the tab's last assignment
				// was the last action sent: the stream asks to carry.
				carry := lastTB != nil && rapid.Bool().Draw(rt, "again")
				if carry {
					burst, rate = lastTB.burst, lastTB.rate
				}
				c, l := tb.assign(now, burst, rate, ttl, carry)
				apply(c)
				apply(l)
				if carry && l.lend == 0 {
					carried++
				}
				a := action{sent: now, ttl: ttl, burst: burst, rate: rate, idx: sent, carry: carry}
				e.inflight = append(e.inflight, a)
				lastTB = &a
				sent++
			case 2: // DENY_ALL, ALLOW_ALL or abandon: ends the assignment
				if closed {
					continue
				}
				apply(tb.cut(now))
				e.inflight = append(e.inflight, action{sent: now, deny: true, idx: sent})
				lastTB = nil
				sent++
			case 3: // Envoy receives early
				deliver(false)
			case 4: // Envoy admits what it may now
				seq++
				spend(e.spend(now), activeIdx())
			case 5: // Envoy reports, maybe with unfunded admissions
				if e.active == nil || e.active.deny {
					e.unrep += float64(rapid.IntRange(0, 3).Draw(rt, "unfunded"))
				}
				e.reports = append(e.reports, report{sent: now, allowed: e.unrep})
				e.unrep = 0
			case 6: // a report arrives early
				deliverReport(false)
			case 7: // the stream ends
				if !closed {
					closed = true
					apply(tb.close(now))
				}
			case 8:
				apply(tb.settle(now))
			}
			seq++
			snaps = append(snaps, snap{seq, sent, tb.lent, refilled})
			if d := tb.lent - lentModel; d > 1e-6 || d < -1e-6 || tb.lent < -1e-6 {
				rt.Fatalf("tab lent %v, moves say %v", tb.lent, lentModel)
			}
			if d := tb.rate - rateModel; d > 1e-6 || d < -1e-6 {
				rt.Fatalf("tab holds rate %v, moves say %v", tb.rate, rateModel)
			}
			// Every bucket Envoy started full was paid for by a loan:
			// a carried assignment lends nothing and must fill nothing.
			if e.fills > reserved+1e-9 {
				rt.Fatalf("Envoy's buckets started with %v tokens, %v were lent", e.fills, reserved)
			}
			if r := envoyRate(); r > tb.rate+1e-9 {
				rt.Fatalf("Envoy may refill at %v, the tab holds rate %v", r, tb.rate)
			}
		}
		rt.Log("carried", carried)
		// Everything ends: deliveries, expiries, reports, forfeits.
		advance(10_000_000)
		deliver(true)
		deliverReport(true)
		if !closed {
			apply(tb.close(now))
		}
		apply(tb.settle(now))
		if !tb.empty() || tb.lent > 1e-6 || lentModel > 1e-6 || rateModel > 1e-6 {
			rt.Fatalf("after the end: %d assignments, %v still lent, rate %v", len(tb.as), tb.lent, tb.rate)
		}
		if back+funded > reserved+refilled+1e-6 {
			rt.Fatalf("gave back %v with %v spent of %v lent and %v refilled: %v tokens minted", back, funded, reserved, refilled, back+funded-reserved-refilled)
		}
		for _, s := range snaps {
			var later float64
			for _, u := range uses {
				// Spent later under an assignment sent by then.
				if u.seq > s.seq && u.idx < s.sent {
					later += u.n
				}
			}
			if more := refilled - s.refilled; later > s.lent+more+1e-6 {
				rt.Fatalf("at step seq %d %v lent and %v refilled after, but Envoy spent %v after", s.seq, s.lent, more, later)
			}
		}
	})
}
