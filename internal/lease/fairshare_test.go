package lease

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

func TestFairShare(t *testing.T) {
	inf := math.Inf(1)
	nan := math.NaN()
	tests := []struct {
		name     string
		capacity float64
		demands  []float64
		weights  []float64
		mins     []float64
		maxs     []float64
		want     []float64
	}{
		{"no holders", 10, nil, nil, nil, nil, []float64{}},
		{"one holder under capacity gets its demand", 10, []float64{3}, nil, nil, nil, []float64{3}},
		{"one holder over capacity gets all of it", 10, []float64{30}, nil, nil, nil, []float64{10}},
		{"equal demands split equally", 10, []float64{100, 100}, nil, nil, nil, []float64{5, 5}},
		{"a small demand is met, the rest is split", 10, []float64{2, 100, 100}, nil, nil, nil, []float64{2, 4, 4}},
		{"everything fits: everyone gets its demand", 10, []float64{2, 3, 4}, nil, nil, nil, []float64{2, 3, 4}},
		{"weights split in proportion", 10, []float64{100, 100}, []float64{1, 3}, nil, nil, []float64{2.5, 7.5}},
		{"weights after a met demand", 12, []float64{1, 100, 100}, []float64{1, 1, 2}, nil, nil, []float64{1, 11.0 / 3, 22.0 / 3}},
		{"floor granted whatever the demand", 10, []float64{0, 100}, nil, []float64{2, 2}, nil, []float64{2, 8}},
		{"ceiling caps a share, the rest goes to others", 10, []float64{100, 100}, nil, nil, []float64{3, inf}, []float64{3, 7}},
		{"floors above capacity are themselves shared", 3, []float64{5, 5, 5}, nil, []float64{2, 2, 2}, nil, []float64{1, 1, 1}},
		{"floors above capacity, weighted", 3, []float64{5, 5}, []float64{1, 2}, []float64{2, 2}, nil, []float64{1, 2}},
		{"zero capacity", 0, []float64{1, 2}, nil, nil, nil, []float64{0, 0}},
		{"zero demands", 10, []float64{0, 0}, nil, nil, nil, []float64{0, 0}},
		{"infinite capacity gives every target", inf, []float64{1, 2}, nil, []float64{0, 5}, nil, []float64{1, 5}},
		{"NaN capacity counts as zero", nan, []float64{1}, nil, nil, nil, []float64{0}},
		{"NaN and negative demands count as zero", 10, []float64{nan, -5, 4}, nil, nil, nil, []float64{0, 0, 4}},
		{"bad weights count as one", 10, []float64{100, 100}, []float64{nan, -1}, nil, nil, []float64{5, 5}},
		{"bad floors count as zero", 10, []float64{100, 100}, nil, []float64{nan, inf}, nil, []float64{5, 5}},
		{"maximum below floor is the floor", 10, []float64{100, 100}, nil, []float64{4, 0}, []float64{1, nan}, []float64{4, 6}},
		{"short slices default the rest", 10, []float64{100, 100, 100}, []float64{2}, []float64{}, []float64{inf}, []float64{5, 2.5, 2.5}},
		{"extreme weights", 2, []float64{10, 10}, []float64{1e-6, 1e6}, nil, nil, []float64{2e-12, 2 - 2e-12}},
		{"infinite demand takes what is left", 10, []float64{inf, 4}, nil, nil, nil, []float64{6, 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := FairShare(tt.capacity, tt.demands, tt.weights, tt.mins, tt.maxs)
			if len(got) != len(tt.want) {
				t.Fatalf("FairShare = %v, want %v", got, tt.want)
			}
			for i := range got {
				if !(math.Abs(got[i]-tt.want[i]) <= 1e-9*max(1, math.Abs(tt.want[i]))) {
					t.Fatalf("FairShare(%v, %v, %v, %v, %v) = %v, want %v",
						tt.capacity, tt.demands, tt.weights, tt.mins, tt.maxs, got, tt.want)
				}
			}
		})
	}
}

// TestFairShareProperties checks the contract of FairShare on random inputs:
// the sum stays within capacity and uses all of it when anyone wants more,
// shares are within their bounds when the floors fit, and the allocation is
// max-min fair: whoever gets less than its target has at least the
// (weighted) share of anyone above their floor.
func TestFairShareProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 20).Draw(t, "n")
		capacity := rapid.Float64Range(0, 1000).Draw(t, "capacity")
		d := make([]float64, n)
		w := make([]float64, n)
		lo := make([]float64, n)
		hi := make([]float64, n)
		for i := range n {
			d[i] = rapid.SampledFrom([]float64{0, 1, 50, 1000}).Draw(t, "demand kind")
			if rapid.Bool().Draw(t, "random demand") {
				d[i] = rapid.Float64Range(0, 500).Draw(t, "demand")
			}
			w[i] = rapid.Float64Range(0.1, 10).Draw(t, "weight")
			if rapid.Bool().Draw(t, "floor") {
				lo[i] = rapid.Float64Range(0, 60).Draw(t, "min")
			}
			hi[i] = math.Inf(1)
			if rapid.Bool().Draw(t, "ceiling") {
				hi[i] = lo[i] + rapid.Float64Range(0, 200).Draw(t, "max-min")
			}
		}
		got := FairShare(capacity, d, w, lo, hi)
		if len(got) != n {
			t.Fatalf("len = %d, want %d", len(got), n)
		}
		eps := 1e-9 * max(1, capacity)
		target := make([]float64, n)
		var sum, sumLo, sumTarget float64
		for i := range n {
			if !finite(got[i]) || got[i] < 0 {
				t.Fatalf("share[%d] = %v", i, got[i])
			}
			target[i] = max(lo[i], min(d[i], hi[i]))
			sum += got[i]
			sumLo += lo[i]
			sumTarget += target[i]
		}
		if sum > capacity+eps {
			t.Fatalf("sum %v > capacity %v: %v", sum, capacity, got)
		}
		floor := lo
		if sumLo > capacity {
			// Infeasible floors: the floors are the targets, shared from 0.
			target, floor = lo, make([]float64, n)
		}
		if want := min(capacity, sumTarget); sumLo <= capacity && math.Abs(sum-want) > eps*float64(n+1) {
			t.Fatalf("sum %v, want min(capacity, sum of targets) = %v: idle capacity", sum, want)
		}
		for i := range n {
			if got[i] < floor[i]-eps || got[i] > target[i]+eps {
				t.Fatalf("share[%d] = %v outside [%v, %v]", i, got[i], floor[i], target[i])
			}
		}
		for i := range n {
			if got[i] >= target[i]-eps {
				continue // satisfied
			}
			for j := range n {
				if got[j] > floor[j]+eps && got[j]/w[j] > got[i]/w[i]+eps {
					t.Fatalf("not max-min fair: holder %d (%v of %v, weight %v) below target while %d has %v at weight %v",
						i, got[i], target[i], w[i], j, got[j], w[j])
				}
			}
		}
		// Deterministic, and blind to the order of holders.
		if again := FairShare(capacity, d, w, lo, hi); !slices.Equal(again, got) {
			t.Fatalf("second call %v != first %v", again, got)
		}
		perm := rapid.Permutation(seq(n)).Draw(t, "perm")
		pd, pw, plo, phi := permute(d, perm), permute(w, perm), permute(lo, perm), permute(hi, perm)
		pgot := FairShare(capacity, pd, pw, plo, phi)
		for k, i := range perm {
			if math.Abs(pgot[k]-got[i]) > eps {
				t.Fatalf("permuted share of holder %d = %v, unpermuted %v", i, pgot[k], got[i])
			}
		}
	})
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

func permute(s []float64, perm []int) []float64 {
	out := make([]float64, len(s))
	for k, i := range perm {
		out[k] = s[i]
	}
	return out
}

func BenchmarkFairShare(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("holders=%d", n), func(b *testing.B) {
			d := make([]float64, n)
			w := make([]float64, n)
			lo := make([]float64, n)
			hi := make([]float64, n)
			for i := range n {
				d[i], w[i], lo[i], hi[i] = float64(i%17)*3, 1+float64(i%3), 0.5, 40
			}
			b.ReportAllocs()
			for b.Loop() {
				FairShare(float64(n)*10, d, w, lo, hi)
			}
		})
	}
}

// fillWithLeftover (the targets' fill) keeps every holder at least at its
// demand share, within its maximum, and leaves nothing idle that some
// holder's maximum could take: the whole capacity is assigned whenever the
// maxima allow, whatever the demands.
func TestFillWithLeftoverProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 12).Draw(t, "n")
		capacity := rapid.Float64Range(0, 1000).Draw(t, "capacity")
		d, w, lo, hi := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
		for i := range n {
			d[i] = rapid.Float64Range(0, 500).Draw(t, "demand")
			w[i] = rapid.Float64Range(0.1, 10).Draw(t, "weight")
			if rapid.Bool().Draw(t, "floor") {
				lo[i] = rapid.Float64Range(0, 30).Draw(t, "min")
			}
			hi[i] = 2 * MaxValue
			if rapid.Bool().Draw(t, "ceiling") {
				hi[i] = lo[i] + rapid.Float64Range(0, 200).Draw(t, "max-min")
			}
		}
		base := FairShare(capacity, d, w, lo, hi)
		got := fillWithLeftover(capacity, d, w, lo, hi)
		eps := 1e-9 * max(1, capacity)
		var sum, sumHi float64
		for i := range n {
			if got[i] < base[i]-eps || got[i] > max(base[i], hi[i])+eps {
				t.Fatalf("share[%d] = %v outside [demand share %v, max %v]", i, got[i], base[i], hi[i])
			}
			sum += got[i]
			sumHi += max(base[i], hi[i])
		}
		if sum > capacity+eps*float64(n+1) {
			t.Fatalf("sum %v > capacity %v", sum, capacity)
		}
		if want := min(capacity, sumHi); math.Abs(sum-want) > eps*float64(n+1) {
			t.Fatalf("sum %v, want %v: capacity left idle that a maximum allows (%v)", sum, want, got)
		}
	})
}
