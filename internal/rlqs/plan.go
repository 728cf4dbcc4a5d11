package rlqs

import (
	"math"

	"github.com/ration-dev/ration/internal/rules"
)

// sizes is a token bucket assignment: max_tokens, tokens_per_fill per
// second (fill_interval is always 1s) and the TTL in whole seconds.
//
// Envoy (global_client_impl.cc) reads both durations in whole seconds only
// (a fill_interval under 1s divides by zero, a TTL of 1.5s lasts 1s) and
// keeps a bucket of identical max_tokens and tokens_per_fill when it
// compares a new assignment, whatever its fill_interval's seconds: so the
// interval never changes, and the rate is tokens_per_fill.
type sizes struct {
	burst, rate float64
	ttl         int64 // seconds
}

// reserve is the part of a lease's rate never lent to Envoys: the lease's
// own refill, which funds the M of later assignments (each is charged in
// full, tab.go) and the agent's own RLS decisions.
const reserve = 0.1

// want is the assignment the server would like for a bucket of rule r
// whose Envoy asks for demand tokens per second: half as much again as it
// asks (at least 1/s), within the rule's rate; as burst, the rule's
// burst; the longest TTL. fit cuts it to what the lease offers.
func want(r *rules.Rule, demand float64, maxTTL int64) sizes {
	rate := math.Ceil(max(1, demand*1.5))
	rate = max(1, min(rate, math.Floor(r.Rate)))
	burst := max(1, math.Floor(r.Burst))
	return sizes{burst: burst, rate: rate, ttl: maxTTL}
}

// offer is what a lease can lend a bucket at the time (holder.Offer, with
// the bucket's share of the lease's rate among the buckets it funds).
type offer struct {
	tokens, rate, leaseRate float64
	// share is the bucket's part of the lease's rate less the reserve,
	// per second (shares.share): a rate, not a fraction, so that a fair
	// level of whole tokens is not floored one below by rounding.
	share      float64
	validUntil int64
}

// fit shrinks z to what o funds with the assignment ending (sent at now,
// plus its TTL and delta) before o.validUntil: the TTL to the validity; the
// rate to the bucket's share of the lease's rate less the reserve, and to
// what is not lent; the burst to half the tokens spendable (the next
// bucket, or this one's next assignment, finds the rest). ok is false when
// not even {1, 1, 1s} fits.
func fit(z sizes, o offer, now, delta int64) (sizes, bool) {
	z.ttl = min(z.ttl, (o.validUntil-now-delta-1)/1e6)
	if z.ttl < 1 {
		return sizes{}, false
	}
	z.rate = math.Floor(min(z.rate, o.rate, o.leaseRate*(1-reserve), max(0, o.share)))
	z.burst = math.Floor(min(z.burst, max(1, o.tokens/2), o.tokens))
	if z.burst < 1 || z.rate < 1 {
		return sizes{}, false
	}
	return z, true
}

// smaller is the least of two sizes, field by field.
func smaller(a, b sizes) sizes {
	return sizes{burst: min(a.burst, b.burst), rate: min(a.rate, b.rate), ttl: min(a.ttl, b.ttl)}
}
