package lease

import (
	"cmp"
	"math"
	"slices"
)

// FairShare divides capacity among holders by weighted max-min fairness
// (water-filling). It is pure and deterministic: the same inputs give the
// same bits on every replica.
//
// Holder i asks for demands[i], has weight weights[i] (default 1) and must get
// a share within [mins[i], maxs[i]] (defaults 0 and +Inf). A nil weights,
// mins or maxs slice means the default for everyone; a shorter slice gives
// the default to the missing holders. The result has len(demands) entries.
//
// Contract:
//   - The floor mins[i] is granted whatever the demand (an idle holder keeps
//     its minimum slice); above it a holder gets at most min(demand, max).
//     So holder i's target is hi[i] = max(mins[i], min(demands[i], maxs[i])).
//   - Feasible (sum of floors <= capacity): every share is in
//     [mins[i], hi[i]], the sum is min(capacity, sum hi) (no capacity is
//     left idle while someone wants more), and there is a water level L such
//     that share[i] = clamp(L*weights[i], mins[i], hi[i]). Hence a holder
//     that gets less than it asked for has at least as much per unit of
//     weight as any holder above its floor: nobody below its demand gets
//     less than an equal (weighted) share of what is left.
//   - Infeasible (sum of floors > capacity): the floors themselves are
//     water-filled, so share[i] = clamp(L*weights[i], 0, mins[i]) summing to
//     capacity.
//
// Bad numbers do not panic: a NaN or negative capacity or demand counts as 0,
// a NaN, infinite or non-positive weight as 1, a NaN, negative or infinite
// floor as 0, a NaN maximum as none, and a maximum below the floor as the
// floor. Floating-point rounding may make the sum exceed capacity by a few
// ulps; the state machine clamps to what is available anyway.
func FairShare(capacity float64, demands, weights, mins, maxs []float64) []float64 {
	n := len(demands)
	out := make([]float64, n)
	if n == 0 {
		return out
	}
	if !(capacity >= 0) {
		capacity = 0
	}
	buf := make([]float64, 3*n)
	lo, hi, w := buf[:n], buf[n:2*n], buf[2*n:]
	var sumLo float64
	for i, d := range demands {
		wi := at(weights, i, 1)
		if !(wi > 0) || math.IsInf(wi, 0) {
			wi = 1
		}
		l := at(mins, i, 0)
		if !(l >= 0) || math.IsInf(l, 0) {
			l = 0
		}
		h := at(maxs, i, math.Inf(1))
		if math.IsNaN(h) {
			h = math.Inf(1)
		}
		if !(d >= 0) {
			d = 0
		}
		w[i], lo[i], hi[i] = wi, l, max(l, min(d, h))
		sumLo += l
	}
	if sumLo > capacity {
		// Infeasible: share the floors, from zero.
		copy(hi, lo)
		clear(lo)
	}
	waterFill(capacity, lo, hi, w, out)
	return out
}

func at(s []float64, i int, def float64) float64 {
	if i < len(s) {
		return s[i]
	}
	return def
}

// level is a water level at which one holder starts (its floor is reached)
// or stops (its target is reached) rising.
type level struct {
	at    float64 // water level L, in share per unit of weight
	delta float64 // change of the total slope d(sum)/dL: +w or -w
	start bool
	i     int
}

// waterFill sets out[i] = clamp(L*w[i], lo[i], hi[i]) for the level L at which
// the shares sum to capacity, or to hi when everything fits. sum(lo) must be
// <= capacity. The total is piecewise linear and nondecreasing in L, so L is
// found by walking the breakpoints in order.
func waterFill(capacity float64, lo, hi, w, out []float64) {
	var sumHi float64
	for _, h := range hi {
		sumHi += h
	}
	if sumHi <= capacity {
		copy(out, hi)
		return
	}
	levels := make([]level, 0, 2*len(lo))
	var total float64
	for i := range lo {
		total += lo[i]
		if hi[i] > lo[i] {
			levels = append(levels,
				level{at: lo[i] / w[i], delta: w[i], start: true, i: i},
				level{at: hi[i] / w[i], delta: -w[i], i: i})
		}
	}
	// A total order (not just by level) so that every sort algorithm, on
	// every replica, visits ties in the same order.
	slices.SortFunc(levels, func(a, b level) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		if a.start != b.start {
			if a.start {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.i, b.i)
	})
	var slope, prev float64
	rising := 0
	active := make([]bool, len(lo))
	water := math.Inf(1)
	for _, lv := range levels {
		if rising > 0 && slope <= 0 {
			// Adding and removing weights of very different sizes can round
			// the slope to nothing while holders still rise: sum it afresh.
			slope = 0
			for i, a := range active {
				if a {
					slope += w[i]
				}
			}
		}
		if lv.at > prev && rising > 0 {
			next := total + slope*(lv.at-prev)
			if next >= capacity {
				water = prev + (capacity-total)/slope
				break
			}
			total = next
		}
		prev = lv.at
		active[lv.i] = lv.start
		if lv.start {
			rising++
		} else {
			rising--
		}
		slope += lv.delta
		if rising == 0 {
			slope = 0 // cancel the rounding left by adding and removing weights
		}
	}
	for i := range out {
		out[i] = min(max(water*w[i], lo[i]), hi[i])
	}
}
