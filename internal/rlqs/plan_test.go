package rlqs

import "testing"

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
