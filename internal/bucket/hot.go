package bucket

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Hot keys (a rule in mode auto). Such a rule's buckets start in the store
// like any other, but the store also estimates each key's decision rate
// across every agent (it sees every decision), and once a key is hot it
// promotes it: it marks the bucket "leased until T" and, until T, answers
// every take with "leased" instead of deciding. Agents then spend the key's
// budget from coordinator leases, and while they do they keep extending the
// mark (Mark). Once the key has cooled, they stop; the mark lapses at T and
// the bucket resumes, empty as of T.
//
// That hand-over is what keeps the rule's bound, B + r*T over any window,
// across promotions and demotions (docs/leases.md, Hot keys):
//
//   - No admission on the bucket while a mark is live: the one script that
//     decides also reads the mark, atomically.
//   - No admission on a lease after the mark it was spent under lapses:
//     an agent spends a promoted key's lease only while a mark it has seen
//     (in a take's "leased" reply or a Mark's "kept") is live, counted like
//     a lease term from when it SENT that call, on its monotonic clock.
//   - Each promotion has an epoch of its own, and the coordinator's quota for
//     it (rule|subject@epoch) starts with an empty pool; a resumed bucket
//     starts empty. So every leased phase and every store phase that follows
//     another starts with no tokens in hand, and admissions over a window are
//     at most what the first phase held at its start (<= B) plus r per
//     second across all phases.
//
// Stored per key, besides tokens and last: lu (leased until, µs, while
// promoted), ep (the latest promotion's epoch), hr and ht (the decision-rate
// estimate, per second, as of ht µs), calm (no promotion before this µs,
// once a mark has lapsed).

// Hot tunes the hot-key side of a take for a rule in mode auto.
type Hot struct {
	// PromoteAbove is the decision rate, per second across every agent, at
	// which the key is promoted to leases.
	PromoteAbove float64
	// Hold is how long a promotion's mark lasts unless extended (µs): the
	// time agents have to obtain leases and start extending it, and how long
	// a key whose agents all stopped stays off the bucket.
	Hold int64
	// Tau is the time constant of the rate estimate (µs): an exponentially
	// weighted rate, so a step to twice the threshold is seen after about
	// Tau*ln 2.
	Tau int64
}

// Validate reports whether h is usable.
func (h Hot) Validate() error {
	switch {
	case !(h.PromoteAbove > 0) || h.PromoteAbove > MaxValue:
		return fmt.Errorf("%w: hot: promote_above %v must be in (0, %g]", ErrInvalid, h.PromoteAbove, float64(MaxValue))
	case h.Hold <= 0 || h.Hold > MaxHold:
		return fmt.Errorf("%w: hot: hold %dµs must be in (0, %d]", ErrInvalid, h.Hold, MaxHold)
	case h.Tau <= 0 || h.Tau > MaxHold:
		return fmt.Errorf("%w: hot: tau %dµs must be in (0, %d]", ErrInvalid, h.Tau, MaxHold)
	}
	return nil
}

// MaxHold bounds Hold and Tau (µs): an hour.
const MaxHold = int64(time.Hour / time.Microsecond)

// Lease promotion, as a take or a mark reports it.
type Promotion struct {
	// Epoch names the promotion (its start on the store's clock, µs, or one
	// more than the previous epoch): the lease quota is rule|subject@Epoch.
	Epoch int64
	// For is how long the mark lasts after Result.Now (µs).
	For int64
}

// HotState is a hot-key bucket as a store holds it.
type HotState struct {
	State
	LeasedUntil int64   // µs; 0 when not promoted
	Epoch       int64   // the latest promotion's epoch (0: never)
	Rate        float64 // decisions per second, as of RateAt
	RateAt      int64
	Calm        int64 // µs: no promotion before
}

// HotTake is the reference model of one take on a hot-key bucket (the auto
// script, hot.lua, operation for operation). It returns leased (and the
// promotion in force) when the key is promoted: nothing is decided or
// charged. Otherwise it decides as Take does (tokens bit-identical), counts
// the decision in the rate estimate, and promotes the key when the estimate
// reaches h.PromoteAbove, reporting the new promotion with the decision.
func HotTake(s HotState, exists bool, l Limit, h Hot, cost float64, now int64) (st HotState, res Result, leased bool, p Promotion) {
	return HotTakeHeld(s, exists, l, h, cost, 0, now)
}

// HotTakeHeld is HotTake for a held take (Request.HeldFor; take).
func HotTakeHeld(s HotState, exists bool, l Limit, h Hot, cost float64, heldFor, now int64) (st HotState, res Result, leased bool, p Promotion) {
	st, d, leased, p := hotTake(s, exists, l, h, cost, heldFor, now)
	if leased {
		return st, Result{Now: now, Leased: true, Promotion: p}, true, p
	}
	res = d.result(now)
	res.Promotion = p
	return st, res, false, p
}

// hotTake is HotTake with the decision's floats as computed.
func hotTake(s HotState, exists bool, l Limit, h Hot, cost float64, heldFor, now int64) (st HotState, d decision, leased bool, p Promotion) {
	if exists && s.LeasedUntil != 0 {
		if now < s.LeasedUntil {
			return s, decision{}, true, Promotion{Epoch: s.Epoch, For: s.LeasedUntil - now}
		}
		s = s.lapse(h)
	}
	s.State, d = take(s.State, exists, l, cost, heldFor, now)
	if !exists {
		s.LeasedUntil, s.Epoch, s.Rate, s.RateAt, s.Calm = 0, 0, 0, now, 0
	}
	s.count(1, h.Tau, now)
	if s.Rate >= h.PromoteAbove && now >= s.Calm {
		s.Epoch = max(now, s.Epoch+1)
		s.LeasedUntil = now + h.Hold
		p = Promotion{Epoch: s.Epoch, For: h.Hold}
	}
	return s, d, false, p
}

// lapse ends a promotion whose mark has run out: the bucket resumes empty
// as of the mark's end (every token of the leased phase may have been
// spent), refilling from there, and no new promotion comes before one more
// hold has passed. What held takes hold stays held: it may still be spent
// after the lapse, so the bucket still refills to Burst - Held only.
func (s HotState) lapse(h Hot) HotState {
	s.Tokens = 0
	if s.LeasedUntil > s.Last {
		s.Last = s.LeasedUntil
	}
	s.Calm = s.LeasedUntil + h.Hold
	s.LeasedUntil = 0
	return s
}

// count adds n decisions at now to the rate estimate: decay by
// exp(-elapsed/tau), then add n/tau per second.
func (s *HotState) count(n float64, tau, now int64) {
	elapsed := now - s.RateAt
	if elapsed < 0 {
		elapsed = 0
	}
	s.Rate = s.Rate*math.Exp(-float64(elapsed)/float64(tau)) + n*1e6/float64(tau)
	if now > s.RateAt {
		s.RateAt = now
	}
}

// MarkVerdict is a mark's answer.
type MarkVerdict uint8

const (
	// MarkKept: the mark is extended; go on spending the lease.
	MarkKept MarkVerdict = iota + 1
	// MarkCool: the key has cooled below demote_below; the mark was not
	// extended. Spend only while the mark seen last is live, then go back
	// to the store.
	MarkCool
	// MarkGone: the promotion named is over (lapsed, or a later one is in
	// force, or the key is gone): stop spending its lease now.
	MarkGone
)

func (v MarkVerdict) String() string {
	switch v {
	case MarkKept:
		return "kept"
	case MarkCool:
		return "cool"
	case MarkGone:
		return "gone"
	}
	return fmt.Sprintf("MarkVerdict(%d)", uint8(v))
}

// MarkRequest extends the mark of the promotion Epoch of Key by Hold, and
// counts Count decisions the agent made on its lease since its last mark.
type MarkRequest struct {
	Key         string
	Limit       Limit // the rule's shape: the bucket's expiry follows it
	Epoch       int64
	Count       float64
	Hold, Tau   int64   // µs
	DemoteBelow float64 // decisions per second across every agent
}

// Validate checks a mark before any I/O.
func (m MarkRequest) Validate() error {
	switch {
	case m.Key == "":
		return fmt.Errorf("%w: mark: empty key", ErrInvalid)
	case m.Limit.Validate() != nil:
		return fmt.Errorf("mark: %w", m.Limit.Validate())
	case m.Epoch <= 0:
		return fmt.Errorf("%w: mark: epoch %d must be > 0", ErrInvalid, m.Epoch)
	case !(m.Count >= 0) || m.Count > MaxValue:
		return fmt.Errorf("%w: mark: count %v must be in [0, %g]", ErrInvalid, m.Count, float64(MaxValue))
	case m.Hold <= 0 || m.Hold > MaxHold || m.Tau <= 0 || m.Tau > MaxHold:
		return fmt.Errorf("%w: mark: hold %dµs and tau %dµs must be in (0, %d]", ErrInvalid, m.Hold, m.Tau, MaxHold)
	case !(m.DemoteBelow >= 0) || m.DemoteBelow > MaxValue:
		return fmt.Errorf("%w: mark: demote_below %v must be in [0, %g]", ErrInvalid, m.DemoteBelow, float64(MaxValue))
	}
	return nil
}

// MarkResult is a mark's answer: the verdict, how long the mark lasts after
// Now (µs; 0 when gone), and the store's clock reading.
type MarkResult struct {
	Verdict MarkVerdict
	For     int64
	Now     int64
}

// HotMark is the reference model of a mark (hot.lua's mark).
func HotMark(s HotState, exists bool, m MarkRequest, now int64) (HotState, MarkResult) {
	if !exists || s.LeasedUntil == 0 || s.Epoch != m.Epoch || now >= s.LeasedUntil {
		return s, MarkResult{Verdict: MarkGone, Now: now}
	}
	s.count(m.Count, m.Tau, now)
	if s.Rate < m.DemoteBelow {
		return s, MarkResult{Verdict: MarkCool, For: s.LeasedUntil - now, Now: now}
	}
	if until := now + m.Hold; until > s.LeasedUntil {
		s.LeasedUntil = until
	}
	return s, MarkResult{Verdict: MarkKept, For: s.LeasedUntil - now, Now: now}
}

// HotRefund is the reference model of a refund on a hot-key bucket: as
// Refund, except that a promoted bucket (live or lapsed mark) is left alone:
// its tokens are the leases' now, and a lapse empties it anyway.
func HotRefund(s HotState, l Limit, cost float64, now int64) HotState {
	if s.LeasedUntil != 0 {
		return s
	}
	s.State = Refund(s.State, l, cost, now)
	return s
}

// hotExpiresAfter is how long after now a hot-key bucket may be forgotten
// (µs; 0 = never): as expiresAfter, and never while its mark may still be
// read, so the mark is never lost to expiry (a promoted key's bucket is
// empty at the lapse, which a missing, hence full, bucket would not be).
func hotExpiresAfter(s HotState, l Limit, now int64) int64 {
	ttl := expiresAfter(s.State, l, now)
	if ttl == 0 || s.LeasedUntil == 0 {
		return ttl
	}
	full := int64(math.Ceil(l.Burst / l.Rate * 1e6))
	if t := s.LeasedUntil - now + full + int64(expiryMargin/time.Microsecond); t > ttl {
		if t >= keepForever {
			return 0
		}
		ttl = t
	}
	return ttl
}

// ErrNotHot marks a mark sent to a store that has no hot keys.
var ErrNotHot = errors.New("bucket store has no hot keys")
