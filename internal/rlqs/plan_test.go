package rlqs

import (
	"math"
	"testing"
	"time"
)

// fit never sizes an assignment that could be spent after the lease's
// validity (sent at now, received by now+delta, TTL in whole seconds), nor
// one that lends more tokens than the lease holds.
func TestFitWithinLease(t *testing.T) {
	const delta = 200_000
	w := sizes{burst: 100, rate: 100, ttl: 5}
	tests := []struct {
		name            string
		avail           float64
		now, validUntil int64
		ok              bool
		wantTTL         int64
	}{
		{"validity bounds the TTL", 1e6, 0, 2_500_000, true, 2},
		{"exactly at the edge", 1e6, 0, 3_200_000, true, 2},
		{"past the edge", 1e6, 0, 3_200_001, true, 3},
		{"too little validity", 1e6, 0, 1_100_000, false, 0},
		{"the balance bounds the burst, not the TTL", 150, 0, 10e6, true, 5},
		{"nothing fits", 0.5, 0, 10e6, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z, ok := fit(w, offer{tokens: tt.avail, rate: 1e6, leaseRate: 1e6, share: 1e6, validUntil: tt.validUntil}, tt.now, delta)
			if ok != tt.ok {
				t.Fatalf("fit = %+v, %v; want ok %v", z, ok, tt.ok)
			}
			if !ok {
				return
			}
			if end := tt.now + z.ttl*1e6 + delta; end >= tt.validUntil {
				t.Fatalf("fit = %+v: ends at %d, not before the lease's validity %d", z, end, tt.validUntil)
			}
			if z.burst > tt.avail {
				t.Fatalf("fit = %+v lends %v tokens, the lease holds %v", z, z.burst, tt.avail)
			}
			if z.ttl != tt.wantTTL {
				t.Fatalf("fit = %+v, want TTL %d", z, tt.wantTTL)
			}
		})
	}
}

// A share under 1/s is sent as whole tokens over whole seconds, never
// rounded down to nothing; a whole share keeps its 1s interval, and
// rounding loses less than 1/16 of a token a second. Every rate's
// tokens_per_fill over its interval is the rate itself.
func TestRateWithin(t *testing.T) {
	for _, c := range []float64{1.0 / 86399, 0.001, 0.05, 0.1125, 0.45, 0.9, 0.99, 1, 1.5, 2.25, 4.5, 7, 19.99, 1e9} {
		r, k, ok := rateWithin(c)
		if !ok || r <= 0 || r > c {
			t.Errorf("rateWithin(%v) = %v over %ds, %v: want a rate in (0, %v]", c, r, k, ok, c)
			continue
		}
		if c >= 1 && c-r >= 1.0/16 {
			t.Errorf("rateWithin(%v) = %v: loses %v a second", c, r, c-r)
		}
		if c == math.Floor(c) && c < 1e9 && (r != c || k != 1) {
			t.Errorf("rateWithin(%v) = %v over %ds, want %v over 1s", c, r, k, c)
		}
		f, kk := sizes{rate: r, interval: k}.perFill()
		if kk != k || math.Abs(float64(f)/float64(k)-r) > 1e-9 || f < 1 {
			t.Errorf("rateWithin(%v) = %v over %ds: sent as %d over %ds", c, r, k, f, kk)
		}
	}
	for _, c := range []float64{0, -1, 1.0 / 86401, math.NaN()} {
		if r, k, ok := rateWithin(c); ok {
			t.Errorf("rateWithin(%v) = %v over %ds: want none", c, r, k)
		}
	}
}

// Envoy compares a fill interval's nanos only: no two intervals or
// generations may share them, and each reads as its whole seconds.
func TestIntervalNanosDistinct(t *testing.T) {
	seen := map[int32]bool{}
	for k := int64(1); k <= maxInterval; k++ {
		for _, gen := range []bool{false, true} {
			n := intervalNanos(k, gen)
			if seen[n] {
				t.Fatalf("interval %ds (gen %v): nanos %d used twice", k, gen, n)
			}
			seen[n] = true
			if n < 0 || n >= 1e9 || (time.Duration(k)*time.Second+time.Duration(n))/time.Second != time.Duration(k) {
				t.Fatalf("interval %ds (gen %v): nanos %d does not read as %ds", k, gen, n, k)
			}
		}
	}
}

// fit funds a bucket whose share of the lease's rate is under 1/s: the
// cliff to DENY_ALL was rounding it down to 0.
func TestFitFundsSharesUnderOne(t *testing.T) {
	w := sizes{burst: 10, rate: 5, ttl: 5}
	for _, share := range []float64{0.9, 0.45, 0.1125, 0.01} {
		z, ok := fit(w, offer{tokens: 10, rate: 5, leaseRate: 5, share: share, validUntil: 10e6}, 0, 200_000)
		if !ok || z.rate <= 0 || z.rate > share || z.burst < 1 {
			t.Errorf("share %v: fit = %+v, %v; want a rate in (0, %v] and a token", share, z, ok, share)
		}
	}
}
