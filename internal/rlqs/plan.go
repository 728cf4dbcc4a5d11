package rlqs

import (
	"math"

	"github.com/ration-dev/ration/internal/rules"
)

// sizes is a token bucket assignment: max_tokens, a refill rate per
// second and the TTL in whole seconds. The rate is tokens_per_fill over a
// fill_interval of a whole number of seconds (interval; 0 stands for 1):
// a share of a lease's rate under 1/s is sent as 1 token every few
// seconds, not rounded down to nothing.
//
// Envoy (global_client_impl.cc) reads both durations in whole seconds only
// (a fill_interval under 1s divides by zero, a TTL of 1.5s lasts 1s), and
// refills its bucket continuously at tokens_per_fill / fill_interval per
// second. It keeps (carries over) a bucket when a new assignment has the
// same max_tokens, tokens_per_fill and fill_interval nanos: the seconds
// are not compared. So the interval's nanos say which interval it is
// (intervalNanos), and a change of interval is a change Envoy sees.
type sizes struct {
	burst, rate float64
	interval    int64 // seconds; 0 is 1
	ttl         int64 // seconds
	// gen tells apart two assignments of equal sizes (intervalNanos): a
	// flipped gen makes Envoy start a new, full bucket for an assignment
	// that lent or took its whole max_tokens, which it would otherwise
	// carry on, leaving those tokens unspent (act).
	gen bool
}

// same says whether a and b are the same assignment to Envoy, but for
// their TTL and gen.
func same(a, b sizes) bool {
	return a.burst == b.burst && a.rate == b.rate && max(1, a.interval) == max(1, b.interval)
}

// maxInterval bounds a fill interval: a share under 1/86400 per second
// funds nothing.
const maxInterval = 86400

// perFill is z's tokens_per_fill and fill_interval in seconds.
func (z sizes) perFill() (uint32, int64) {
	k := max(1, z.interval)
	return uint32(math.Round(z.rate * float64(k))), k
}

// intervalNanos is the nanos of a fill interval of k seconds of
// generation gen: 0 for 1s, k otherwise, and half a second more for gen,
// so that no two intervals or generations have the same (Envoy compares
// the nanos only, and reads the whole seconds: k seconds and up to half
// a second more refill at tokens_per_fill / k).
func intervalNanos(k int64, gen bool) int32 {
	var n int32
	if k > 1 {
		n = int32(k)
	}
	if gen {
		n += 500_000_000
	}
	return n
}

// rateWithin is the largest rate of the form f/k tokens per second, f a
// whole number of tokens and k of seconds, within c, as sizes' rate and
// interval (f/k in lowest terms); ok false when not even 1/maxInterval
// fits. k is searched from the smallest interval that funds a token up to
// 16 past it (64 under 1/s), so a share loses less than 1/16 of a token a
// second to rounding, not up to a whole one.
func rateWithin(c float64) (rate float64, interval int64, ok bool) {
	if !(c > 0) {
		return 0, 0, false
	}
	c = min(c, math.MaxUint32)
	k0 := int64(1)
	if c < 1 {
		if 1/c >= maxInterval {
			return 0, 0, false
		}
		k0 = int64(math.Ceil(1 / c))
		for k0 < maxInterval && 1/float64(k0) > c { // rounding
			k0++
		}
	}
	last := k0 + 15
	if c < 1 {
		last = max(k0, 64)
	}
	var bestF, bestK int64
	for k := k0; k <= last && k <= maxInterval; k++ {
		f := int64(math.Floor(c * float64(k)))
		for f > 0 && float64(f)/float64(k) > c { // rounding
			f--
		}
		if f > 0 && (bestK == 0 || f*bestK > bestF*k) {
			bestF, bestK = f, k
		}
	}
	if bestK == 0 || bestF > math.MaxUint32 {
		return 0, 0, false
	}
	g := gcd(bestF, bestK)
	bestF, bestK = bestF/g, bestK/g
	return float64(bestF) / float64(bestK), bestK, true
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return max(1, a)
}

// reserve is the part of a lease's rate never lent to Envoys: the lease's
// own refill, which funds the M of later assignments (each new bucket is
// charged in full, tab.go) and the agent's own RLS decisions. (Lending it
// whenever the balance held half the cap changed nothing: the M lent to
// carried buckets keeps the balance low.)
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
	maxBurst   float64 // the most max_tokens one bucket is lent (0: no bound)
}

// lendable is the most rate one bucket may be lent: what is not lent
// (counting what the bucket holds) less the reserve of the whole lease's
// rate, so that all the loans together leave the reserve to the lease.
func (o offer) lendable() float64 {
	return min(o.rate-o.leaseRate*reserve, o.leaseRate*(1-reserve))
}

// fit shrinks z to what o funds with the assignment ending (sent at now,
// plus its TTL and delta) before o.validUntil: the TTL to the validity; the
// rate to the bucket's share of the lease's rate less the reserve, and to
// what is not lent, as a whole number of tokens over a whole number of
// seconds (rateWithin: a share under 1/s refills over several seconds,
// never nothing); the burst to half the tokens spendable (the next
// bucket, or this one's next assignment, finds the rest). ok is false when
// not even one token fits.
func fit(z sizes, o offer, now, delta int64) (sizes, bool) {
	z.ttl = min(z.ttl, (o.validUntil-now-delta-1)/1e6)
	if z.ttl < 1 {
		return sizes{}, false
	}
	rate, k, ok := rateWithin(min(z.rate, o.lendable(), max(0, o.share)))
	if !ok {
		return sizes{}, false
	}
	z.rate, z.interval = rate, k
	z.burst = math.Floor(min(z.burst, max(1, o.tokens/2), o.tokens))
	if o.maxBurst > 0 {
		z.burst = min(z.burst, o.maxBurst)
	}
	if z.burst < 1 {
		return sizes{}, false
	}
	return z, true
}

// smaller is the least of two sizes, field by field; the rate keeps its
// interval.
func smaller(a, b sizes) sizes {
	z := sizes{burst: min(a.burst, b.burst), rate: a.rate, interval: a.interval, ttl: min(a.ttl, b.ttl), gen: a.gen || b.gen}
	if b.rate < a.rate {
		z.rate, z.interval = b.rate, b.interval
	}
	return z
}

// keeps is last, the assignment Envoy holds, with a TTL that fits o, when
// it may be sent again unchanged (Envoy carries its bucket on, and no
// tokens are lent for it): its rate still within what the lease and the
// bucket's demand allow, its burst within w's. The bucket's share does not
// bound it: a share shrinks as buckets join, and a new size is charged a
// whole new max_tokens, which a lease whose cap is lent out cannot pay;
// the bucket keeps its size for its turn (lend).
func keeps(last, w sizes, o offer, now, delta int64) (sizes, bool) {
	ttl := min(w.ttl, (o.validUntil-now-delta-1)/1e6)
	c := min(w.rate, o.lendable())
	if ttl < 1 || last.rate > c || last.burst > w.burst {
		return sizes{}, false
	}
	last.ttl = ttl
	return last, true
}
