package bucket

import (
	"math"
	"time"
)

// State is one bucket as a store holds it.
type State struct {
	Tokens float64 // tokens held at Last, in [0, Burst]
	Last   int64   // µs since the Unix epoch: the latest clock reading applied
}

// Take is the reference model of one decision: the arithmetic every store
// must reproduce exactly. It is pure; now (µs since the epoch) is the store's
// clock reading for this decision.
//
// A missing bucket (exists false) starts full with Last = now. Otherwise:
//
//	elapsed = max(0, now - Last)                 int64 µs, exact
//	tokens  = Tokens + Rate*float64(elapsed)/1e6  evaluated as ((Rate*e)/1e6), then +
//	tokens  = min(Burst, tokens)
//	Last    = max(Last, now)                     a clock stepping back never refills
//	                                             nor moves Last backwards
//
// then, if tokens >= cost: tokens -= cost and allow; else deny with
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
	s, d := take(s, exists, l, cost, now)
	return s, d.result(now)
}

// Refund is the reference model of giving cost back: refill as Take does,
// then add cost, capped at Burst. Last = max(Last, now).
func Refund(s State, l Limit, cost float64, now int64) State {
	s = refill(s, l, now)
	t := s.Tokens + cost
	if t > l.Burst {
		t = l.Burst
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

func take(s State, exists bool, l Limit, cost float64, now int64) (State, decision) {
	if exists {
		s = refill(s, l, now)
	} else {
		s = State{Tokens: l.Burst, Last: now}
	}
	var d decision
	if s.Tokens >= cost {
		s.Tokens -= cost
		d.allowed = true
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

func refill(s State, l Limit, now int64) State {
	elapsed := now - s.Last
	if elapsed < 0 {
		elapsed = 0
	}
	t := s.Tokens + l.Rate*float64(elapsed)/1e6
	if t > l.Burst {
		t = l.Burst
	}
	s.Tokens = t
	if now > s.Last {
		s.Last = now
	}
	return s
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
// from Last (which may lie ahead of now after a clock step), plus the margin.
func expiresAfter(s State, l Limit, now int64) int64 {
	if l.Rate <= 0 {
		return 0
	}
	full := math.Ceil(l.Burst / l.Rate * 1e6)
	if !(full < float64(keepForever)) {
		return 0
	}
	ttl := int64(full) + (s.Last - now) + int64(expiryMargin/time.Microsecond)
	if ttl >= keepForever {
		return 0
	}
	return ttl
}
