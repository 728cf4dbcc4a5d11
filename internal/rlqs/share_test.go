package rlqs

import (
	"math"
	"math/rand/v2"
	"testing"
)

// fairShare gives each bucket its max-min fair part of the lease's rate:
// a claim of any size takes at most an equal part from the buckets asking
// more than the level, and nothing from those asking less.
func TestFairShare(t *testing.T) {
	tests := []struct {
		name     string
		demands  []float64
		capacity float64
		want     []float64 // each bucket's, in the order of demands
	}{
		{"equal demands", []float64{10, 10, 10, 10}, 20, []float64{5, 5, 5, 5}},
		{"one liar", []float64{20, 1 << 40}, 18, []float64{9, 9}},
		{"one liar, an honest bucket below the level", []float64{5, 1 << 40}, 18, []float64{5, 13}},
		{"five liars", []float64{5, 1 << 40, 1 << 40, 1 << 40, 1 << 40, 1 << 40}, 18, []float64{3, 3, 3, 3, 3, 3}},
		{"small demands below the level", []float64{2, 3, 100, 100}, 20, []float64{2, 3, 7.5, 7.5}},
		{"single bucket, demand below the capacity", []float64{5}, 20, []float64{20}},
		{"single bucket, demand above the capacity", []float64{50}, 20, []float64{20}},
		{"demands that fit: the rest in proportion", []float64{2, 6}, 16, []float64{4, 12}},
		{"demands exactly the capacity", []float64{4, 6, 10}, 20, []float64{4, 6, 10}},
		{"capacity 0", []float64{5, 10}, 0, []float64{0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, d := range tt.demands {
				all := append([]float64(nil), tt.demands...)
				if got := fairShare(d, all, tt.capacity); math.Abs(got-tt.want[i]) > 1e-9 {
					t.Errorf("bucket %d of demands %v, capacity %v: %v, want %v", i, tt.demands, tt.capacity, got, tt.want[i])
				}
			}
		})
	}
}

// Over random demands: the parts never sum past the capacity, every
// bucket gets at least the least of its demand and an equal part, and
// the whole capacity is given while any bucket wants more than it gets.
func TestFairShareProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := 1 + r.IntN(12)
		demands := make([]float64, n)
		for i := range demands {
			demands[i] = 1 + r.Float64()*float64(r.IntN(50))
			if r.IntN(6) == 0 {
				demands[i] = 1 << 40
			}
		}
		capacity := float64(r.IntN(60))
		var sum float64
		unmet := false
		for _, d := range demands {
			got := fairShare(d, append([]float64(nil), demands...), capacity)
			sum += got
			if floor := min(d, capacity/float64(n)); got < floor-1e-9 {
				t.Fatalf("demand %v of %v, capacity %v: %v, under %v", d, demands, capacity, got, floor)
			}
			if got < d-1e-9 {
				unmet = true
			}
		}
		if sum > capacity+1e-6 {
			t.Fatalf("demands %v, capacity %v: parts sum to %v", demands, capacity, sum)
		}
		if unmet && sum < capacity-1e-6 {
			t.Fatalf("demands %v, capacity %v: parts sum to %v while a bucket is short", demands, capacity, sum)
		}
	}
}

// A bucket's recorded demand is within 1 and the rule's rate, and is
// forgotten with the bucket.
func TestSharesCapDemand(t *testing.T) {
	s := shares{d: map[string]map[*bucketState]float64{}}
	honest, liar, idle := &bucketState{}, &bucketState{}, &bucketState{}
	s.set("q", honest, 100, 20)
	s.set("q", liar, 1<<40, 20)
	s.set("q", idle, 0, 20)
	if got := s.d["q"][liar]; got != 20 {
		t.Fatalf("a claim of 2^40 recorded as %v, want the rule's rate 20", got)
	}
	if got := s.d["q"][idle]; got != 1 {
		t.Fatalf("an idle bucket's demand recorded as %v, want 1", got)
	}
	// 1 to the idle bucket, the rest split between the two at the level.
	if got := s.share("q", honest, 19); got != 9 {
		t.Fatalf("the honest bucket's share %v, want 9", got)
	}
	s.drop(liar)
	if got := s.share("q", liar, 19); got != 0 {
		t.Fatalf("a dropped bucket's share %v, want 0", got)
	}
	if got := s.share("q", honest, 19); got != 18 {
		t.Fatalf("the honest bucket's share without the liar %v, want 18 (the rest in proportion)", got)
	}
}
