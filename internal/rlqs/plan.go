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

// cost is what an assignment of these sizes may admit: its cap (tab.go).
func (z sizes) cost(delta int64) float64 {
	return capOf(z.burst, z.rate, 0, z.ttl*1e6+delta)
}

// want is the assignment the server would like for a bucket of rule r
// whose Envoy asks for demand tokens per second: half as much again as it
// asks (at least 1/s), within the rule's rate; a second of it as burst,
// within the rule's burst; the longest TTL.
func want(r *rules.Rule, demand float64, maxTTL int64) sizes {
	rate := math.Ceil(max(1, demand*1.5))
	rate = max(1, min(rate, math.Floor(r.Rate)))
	burst := max(1, min(rate, math.Floor(r.Burst)))
	return sizes{burst: burst, rate: rate, ttl: maxTTL}
}

// fit shrinks z to what avail tokens fund with the assignment ending
// (sent at now, plus its TTL and delta) before validUntil: a shorter TTL
// first, then smaller sizes. ok is false when not even {1, 1, 1s} fits.
func fit(z sizes, avail float64, now, validUntil, delta int64) (sizes, bool) {
	z.ttl = min(z.ttl, (validUntil-now-delta-1)/1e6)
	if z.ttl < 1 {
		return sizes{}, false
	}
	for z.ttl > 1 && z.cost(delta) > avail {
		z.ttl--
	}
	if c := z.cost(delta); c > avail {
		k := avail / c
		z.burst, z.rate = math.Floor(z.burst*k), math.Floor(z.rate*k)
	}
	if z.burst < 1 || z.rate < 1 || z.cost(delta) > avail {
		return sizes{}, false
	}
	return z, true
}

// smaller is the least of two sizes, field by field.
func smaller(a, b sizes) sizes {
	return sizes{burst: min(a.burst, b.burst), rate: min(a.rate, b.rate), ttl: min(a.ttl, b.ttl)}
}
