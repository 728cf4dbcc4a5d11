package bucket

import (
	"math"
	"time"
)

// State is one bucket as a store holds it.
type State struct {
	Tokens float64 // tokens held at Last, in [0, Burst - Held]
	Last   int64   // µs since the Unix epoch: the latest clock reading applied
	// Held is what held takes (Request.HeldFor) admitted that may still be
	// spent elsewhere until HeldUntil (µs); 0, with HeldUntil 0, when
	// nothing is held. Until then the bucket refills to Burst - Held only,
	// so Tokens + Held never exceed Burst (see take).
	Held      float64
	HeldUntil int64
}

// Take is the reference model of one decision: the arithmetic every store
// must reproduce exactly. It is pure; now (µs since the epoch) is the store's
// clock reading for this decision.
//
// A missing bucket (exists false) starts full with Last = now. Otherwise:
//
//	elapsed = max(0, now - Last)                 int64 µs, exact
//	tokens  = Tokens + Rate*float64(elapsed)/1e6  evaluated as ((Rate*e)/1e6), then +
//	tokens  = min(Burst - Held, tokens)          Burst - 0 is Burst; never below 0
//	Last    = max(Last, now)                     a clock stepping back never refills
//	                                             nor moves Last backwards
//
// (a hold that ends by now first refills up to HeldUntil this way, then is
// dropped: refill), then, if tokens >= cost: tokens -= cost (and, held,
// Held += cost) and allow; else deny with
// retry = (cost - tokens) / Rate (0 when Rate is 0). reset = (Burst - tokens)
// / Rate (0 when Rate is 0) after the decision.
//
// Float semantics: every step is one IEEE 754 binary64 operation rounded to
// nearest, in exactly the order above, with no fused multiply-add (Go may
// fuse x*y+z, so nothing here adds to a product: the product is divided
// first). The Redis script performs the same operations in the same order on
// Lua 5.1 numbers (C doubles, one VM instruction per operation), reads stored
// floats with strtod and writes them with %.17g, which round-trips binary64
// exactly. Hence Tokens, retry and reset come out bit-identical in both, and
// the tests compare them with ==. Integers (now, Last, elapsed) stay below
// 2^53 and are exact in both languages.
//
// Durations in Result are derived from those floats by one Go function
// (secondsToDuration: rounded up to the nanosecond, saturating), shared by
// every store, so equal floats give equal Results.
func Take(s State, exists bool, l Limit, cost float64, now int64) (State, Result) {
	s, d := take(s, exists, l, cost, 0, now)
	return s, d.result(now)
}

// TakeHeld is Take for a held take (Request.HeldFor): an admitted cost
// is also held, until heldFor µs after Last, as take describes.
func TakeHeld(s State, exists bool, l Limit, cost float64, heldFor, now int64) (State, Result) {
	s, d := take(s, exists, l, cost, heldFor, now)
	return s, d.result(now)
}

// Refund is the reference model of giving cost back: refill as Take does,
// then add cost, capped at Burst - Held. Last = max(Last, now).
func Refund(s State, l Limit, cost float64, now int64) State {
	s = refill(s, l, now)
	t := s.Tokens + cost
	if c := heldCap(l, s.Held); t > c {
		t = c
	}
	s.Tokens = t
	return s
}

// decision is a Take outcome as floats, before conversion to durations. The
// differential tests compare it bit for bit with the Redis script's reply.
type decision struct {
	allowed bool
	tokens  float64 // remaining after the decision
	retry   float64 // seconds
	reset   float64 // seconds
}

func (d decision) result(now int64) Result {
	return Result{
		Allowed:    d.allowed,
		Remaining:  d.tokens,
		RetryAfter: secondsToDuration(d.retry),
		Reset:      secondsToDuration(d.reset),
		Now:        now,
	}
}

// take decides one take. A held take (heldFor > 0) is one whose tokens
// are spent elsewhere, later: an RLQS assignment that Envoy spends for up
// to heldFor µs after it was taken. Its cost, once admitted, is also
// held: Held grows by it and HeldUntil becomes at least Last + heldFor.
// While held, tokens refill to Burst - Held only (refill), so Tokens +
// Held never exceed Burst, and over any window [a, a+T] what the bucket
// admits directly plus what is spent under held takes is at most
// Tokens(a) + Held(a) (all a window can spend of takes made before it)
// plus r*T (refill): B + r*T. Without the cap the bucket would refill to
// B behind tokens still to be spent, and a window would see both.
func take(s State, exists bool, l Limit, cost float64, heldFor, now int64) (State, decision) {
	if exists {
		s = refill(s, l, now)
	} else {
		s = State{Tokens: l.Burst, Last: now}
	}
	var d decision
	if s.Tokens >= cost {
		s.Tokens -= cost
		d.allowed = true
		if heldFor > 0 {
			s.Held += cost
			if e := s.Last + heldFor; e > s.HeldUntil {
				s.HeldUntil = e
			}
		}
	}
	return s, decided(d.allowed, s.Tokens, l, cost)
}

// decided completes a take decision from what it left in the bucket:
// retry = (cost - tokens) / Rate when denied, reset = (Burst - tokens) /
// Rate, both 0 when Rate is 0. A denial leaves tokens as they were before
// it, so these are the operations the model description above lists, in
// its order. The Redis store calls this on the tokens the script replies
// (the script formats one float, not three), so the two cannot drift
// apart.
func decided(allowed bool, tokens float64, l Limit, cost float64) decision {
	d := decision{allowed: allowed, tokens: tokens}
	if l.Rate > 0 {
		if !allowed {
			d.retry = (cost - tokens) / l.Rate
		}
		d.reset = (l.Burst - tokens) / l.Rate
	}
	return d
}

// refill brings s to now. A hold that ends by now is two steps: up to
// its end the bucket refills to Burst - Held only, and only past it to
// Burst (one step capped at Burst would refill, behind the held tokens,
// what the hold was there to keep out).
func refill(s State, l Limit, now int64) State {
	if s.Held != 0 && now >= s.HeldUntil {
		if s.HeldUntil > s.Last {
			t := s.Tokens + l.Rate*float64(s.HeldUntil-s.Last)/1e6
			if c := heldCap(l, s.Held); t > c {
				t = c
			}
			s.Tokens, s.Last = t, s.HeldUntil
		}
		s.Held, s.HeldUntil = 0, 0
	}
	elapsed := now - s.Last
	if elapsed < 0 {
		elapsed = 0
	}
	t := s.Tokens + l.Rate*float64(elapsed)/1e6
	if c := heldCap(l, s.Held); t > c {
		t = c
	}
	s.Tokens = t
	if now > s.Last {
		s.Last = now
	}
	return s
}

// heldCap is what a bucket holding held refills to: Burst - held, and
// never below 0 (a rule reloaded with a burst below what is held).
// Burst - 0 is Burst exactly, so an unheld bucket is capped as before.
func heldCap(l Limit, held float64) float64 {
	c := l.Burst - held
	if c < 0 {
		c = 0
	}
	return c
}

// secondsToDuration converts a wait in seconds to a Duration, rounded up to
// the nanosecond (never tell a client to come back early) and saturating at
// the largest Duration (a tiny rate can put the wait beyond 292 years).
func secondsToDuration(sec float64) time.Duration {
	if !(sec > 0) {
		return 0
	}
	ns := math.Ceil(sec * 1e9)
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// expiryMargin is added to every bucket's time to full before it may be
// forgotten, so float rounding and clock granularity can never make a key
// vanish while the bucket is still short of full.
const expiryMargin = time.Second

// keepForever bounds a time to live: a bucket that would need longer (a tiny
// rate, or rate 0) is kept without expiry. 2^50 µs is about 35 years.
const keepForever = int64(1) << 50

// expiresAfter is how long after now a bucket in state s may be forgotten, in
// µs, or 0 when it must be kept forever: the full refill time B/r counted
// from Last (which may lie ahead of now after a clock step), or from the
// end of a hold past it, plus the margin.
func expiresAfter(s State, l Limit, now int64) int64 {
	if l.Rate <= 0 {
		return 0
	}
	full := math.Ceil(l.Burst / l.Rate * 1e6)
	if !(full < float64(keepForever)) {
		return 0
	}
	from := s.Last
	if s.Held != 0 && s.HeldUntil > from {
		from = s.HeldUntil
	}
	ttl := int64(full) + (from - now) + int64(expiryMargin/time.Microsecond)
	if ttl >= keepForever {
		return 0
	}
	return ttl
}
