package admission

import (
	"math"
	"slices"
	"time"
)

// Span is one admission whose charge happened at a moment that is not
// known exactly, only that it lies in [From, To]: for an agent's record,
// [At - Latency, At] (the decision's batch); for a client, [the call's
// send, its answer's arrival].
type Span struct {
	From, To time.Duration
	Cost     float64
}

// Certain is the overshoot a history of spans proves whatever the exact
// moment of each charge within its span.
//
// The bound is: the cost charged in any window [a, b] is at most
// B + r (b - a). Each admission i was charged at some d_i in
// [From_i, To_i], unknown. For any set A of admissions, every d_i (i in
// A) lies in [min From, max To] over A, so a system that keeps the bound
// has cost(A) <= B + r (max To - min From), however the d_i fall. Hence
//
//	Certain = max over a <= b of  cost{i : a <= From_i, To_i <= b} - B - r (b - a)
//
// is a lower bound of the true overshoot: when it is > 0 (or above a
// scenario's allowed bound), the bound was broken for every possible
// placement of the charges, and timing noise cannot explain it. Counting
// each admission at one instant instead is not conservative either way:
// at its To (the answer's arrival, the latest moment it can have been
// decided) a burst of answers delivered late and together looks bunched;
// widening every window by rate x the slowest admission of the run (the
// old "slack") lets one slow cold start excuse every window. Here each
// window is widened only by its own admissions' spans: counted at their
// To, a window [t0, t1] holding admissions whose earliest From is
// f < t0 is allowed B + r (t1 - f), i.e. B + r (t1 - t0) plus a slack of
// r (t0 - f) <= r x that admission's own latency.
//
// With From == To for every span it equals the leaky-bucket overshoot of
// Check. O(n log n).
type Certain struct {
	Overshoot float64       // -burst when nothing was admitted
	From, To  time.Duration // the window [a, b] where it peaked
	Admitted  float64       // total cost
	Count     int
}

// CertainOvershoot computes Certain for spans of one quota (burst, rate).
func CertainOvershoot(spans []Span, burst, rate float64) Certain {
	c := Certain{Overshoot: -burst}
	n := len(spans)
	if n == 0 {
		return c
	}
	for _, s := range spans {
		c.Admitted += s.Cost
	}
	c.Count = n
	// Candidate right ends b: the distinct To values, sorted. Leaf j holds
	// cost{i : From_i >= a, To_i <= b_j} - r b_j for the current a.
	ends := make([]time.Duration, n)
	for i, s := range spans {
		ends[i] = s.To
	}
	slices.Sort(ends)
	ends = slices.Compact(ends)
	st := newMaxTree(len(ends))
	for j, b := range ends {
		st.set(j, -rate*b.Seconds())
	}
	// Candidate left ends a: the From values, largest first; admissions
	// join as a passes their From.
	byFrom := make([]int, n)
	for i := range byFrom {
		byFrom[i] = i
	}
	slices.SortFunc(byFrom, func(x, y int) int {
		switch {
		case spans[x].From > spans[y].From:
			return -1
		case spans[x].From < spans[y].From:
			return 1
		}
		return 0
	})
	for k := 0; k < n; {
		a := spans[byFrom[k]].From
		for ; k < n && spans[byFrom[k]].From == a; k++ {
			s := spans[byFrom[k]]
			j, _ := slices.BinarySearch(ends, s.To)
			st.add(j, len(ends), s.Cost)
		}
		// b >= a: the ends at or after a (a span's To is never before its
		// From, so every admission counted has its To there).
		lo, _ := slices.BinarySearch(ends, a)
		v, j := st.max(lo, len(ends))
		if o := v + rate*a.Seconds() - burst; o > c.Overshoot {
			c.Overshoot, c.From, c.To = o, a, ends[j]
		}
	}
	return c
}

// maxTree is a segment tree over n leaves with range add and range max
// (with the position of the max).
type maxTree struct {
	n        int
	mx, lazy []float64
	at       []int
}

func newMaxTree(n int) *maxTree {
	t := &maxTree{n: n, mx: make([]float64, 4*n), lazy: make([]float64, 4*n), at: make([]int, 4*n)}
	for i := range t.mx {
		t.mx[i] = math.Inf(-1)
	}
	return t
}

func (t *maxTree) set(i int, v float64) { t.setR(1, 0, t.n, i, v) }

func (t *maxTree) setR(node, lo, hi, i int, v float64) {
	if hi-lo == 1 {
		t.mx[node], t.at[node] = v, lo
		return
	}
	mid := (lo + hi) / 2
	if i < mid {
		t.setR(2*node, lo, mid, i, v)
	} else {
		t.setR(2*node+1, mid, hi, i, v)
	}
	t.pull(node)
}

func (t *maxTree) pull(node int) {
	l, r := 2*node, 2*node+1
	if t.mx[l] >= t.mx[r] {
		t.mx[node], t.at[node] = t.mx[l]+t.lazy[node], t.at[l]
	} else {
		t.mx[node], t.at[node] = t.mx[r]+t.lazy[node], t.at[r]
	}
}

// add adds v to leaves [from, to).
func (t *maxTree) add(from, to int, v float64) { t.addR(1, 0, t.n, from, to, v) }

func (t *maxTree) addR(node, lo, hi, from, to int, v float64) {
	if to <= lo || hi <= from {
		return
	}
	if from <= lo && hi <= to {
		t.mx[node] += v
		t.lazy[node] += v
		return
	}
	mid := (lo + hi) / 2
	t.addR(2*node, lo, mid, from, to, v)
	t.addR(2*node+1, mid, hi, from, to, v)
	t.pull(node)
}

// max is the largest leaf in [from, to) and its index.
func (t *maxTree) max(from, to int) (float64, int) { return t.maxR(1, 0, t.n, from, to) }

func (t *maxTree) maxR(node, lo, hi, from, to int) (float64, int) {
	if to <= lo || hi <= from {
		return math.Inf(-1), -1
	}
	if from <= lo && hi <= to {
		return t.mx[node], t.at[node]
	}
	mid := (lo + hi) / 2
	lv, li := t.maxR(2*node, lo, mid, from, to)
	rv, ri := t.maxR(2*node+1, mid, hi, from, to)
	if rv > lv {
		return rv + t.lazy[node], ri
	}
	return lv + t.lazy[node], li
}
