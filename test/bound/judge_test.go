package bound

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
)

// shape is a rule as one rules file states it: what the bound of a window
// is made of.
type shape struct {
	Mode         string
	Burst, Rate  float64
	DefaultShare float64
}

func (s shape) String() string {
	out := fmt.Sprintf("%s B %g r %g", s.Mode, s.Burst, s.Rate)
	if s.DefaultShare > 0 {
		out += fmt.Sprintf(" default_share %g", s.DefaultShare)
	}
	return out
}

// change is one rules reload of one rule: the file was written at At.
type change struct {
	At       time.Duration
	Rule     string
	From, To shape
}

// modeSwitch reports whether the reload moves the rule's subjects to other
// buckets: between redis and auto the subjects start afresh on other Redis
// keys (docs/configuration.md, mode), which the docs allow one more burst
// per active subject.
func (c change) modeSwitch() bool { return c.From.Mode != c.To.Mode }

// timeline is what the judge knows of one rule's shapes over the run.
type timeline struct {
	initial shape
	changes []change // in time order
	// linger is how long after a reload the old shape may still be in
	// force somewhere: agents read the file within their reload interval,
	// and a leased quota takes its new shape at its next renewal, while
	// the leases granted before it keep their sizes to the end of their
	// terms (lease period + safety margin).
	linger time.Duration
	// lag is how long two agents may decide a subject under different
	// modes after a mode switch (their reload intervals): both buckets
	// refill meanwhile, so a switch is allowed B + r*lag more.
	lag time.Duration
}

// interval is a stretch of the run in which the same shapes may be in
// force: the largest burst and rate among them, and the mode switches
// whose reload is under way in it.
type interval struct {
	from, to  time.Duration // [from, to)
	burst     float64
	rate      float64
	switching []int // indexes into changes
}

func (tl timeline) intervals() []interval {
	cuts := []time.Duration{0}
	for _, c := range tl.changes {
		cuts = append(cuts, c.At, c.At+tl.linger)
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	cuts = append(cuts, time.Duration(math.MaxInt64))
	var out []interval
	for k := 0; k+1 < len(cuts); k++ {
		iv := interval{from: cuts[k], to: cuts[k+1]}
		in := tl.initial
		possible := []shape{}
		for i, c := range tl.changes {
			if c.At <= iv.from {
				in = c.To
			}
			// The old shape lingers in [At, At + linger).
			if c.At <= iv.from && iv.from < c.At+tl.linger {
				possible = append(possible, c.From)
				if c.modeSwitch() {
					iv.switching = append(iv.switching, i)
				}
			}
		}
		possible = append(possible, in)
		for _, s := range possible {
			iv.burst = max(iv.burst, s.Burst)
			iv.rate = max(iv.rate, s.Rate)
		}
		out = append(out, iv)
	}
	return out
}

// verdict is the worst window of one (rule, subject).
type verdict struct {
	Over        float64 // certain overshoot beyond the allowed bound; > 0 is a violation
	From, To    time.Duration
	Burst, Rate float64 // the shape the window was judged against
	Switches    int     // mode switches allowed for in the window
	Admitted    float64 // cost admitted in the window's pair of intervals
	Count       int
}

// judge holds one subject's admissions to the bound: for every window
// [a, b], the cost certainly admitted in it (admission.CertainOvershoot:
// each admission anywhere in its span) at most
//
//	B + r (b - a) + k (B + r lag)
//
// where B and r are the largest burst and rate the rule may have had in
// force anywhere in the window (a reload that grows a rule allows more at
// once; one that shrinks it still allows the old shape for tl.linger
// after the file changed) and k the mode switches under way in it. Each
// pair of intervals (i, j) is judged with the largest shape over i..j,
// counting only the admissions whose spans lie within them: a window
// starting in i and ending in j is judged exactly there, and every other
// window it counts lies within i..j, so is judged no more strictly than
// its own shape would.
func judge(tl timeline, spans []admission.Span) verdict {
	ivs := tl.intervals()
	worst := verdict{Over: math.Inf(-1)}
	for i := range ivs {
		var burst, rate float64
		switches := map[int]bool{}
		for j := i; j < len(ivs); j++ {
			burst, rate = max(burst, ivs[j].burst), max(rate, ivs[j].rate)
			for _, s := range ivs[j].switching {
				switches[s] = true
			}
			var in []admission.Span
			for _, s := range spans {
				if s.From >= ivs[i].from && s.To < ivs[j].to {
					in = append(in, s)
				}
			}
			if len(in) == 0 {
				continue
			}
			extra := float64(len(switches)) * (burst + rate*tl.lag.Seconds())
			c := admission.CertainOvershoot(in, burst, rate)
			if o := c.Overshoot - extra; o > worst.Over {
				worst = verdict{Over: o, From: c.From, To: c.To, Burst: burst, Rate: rate,
					Switches: len(switches), Admitted: c.Admitted, Count: c.Count}
			}
		}
	}
	return worst
}

// The judge on histories whose verdict is known by hand: the bound of a
// window is the largest shape in force in it, an old shape lingers after
// a shrink, and a mode switch allows one more burst.
func TestJudge(t *testing.T) {
	s := func(mode string, b, r float64) shape { return shape{Mode: mode, Burst: b, Rate: r} }
	at := func(sec float64) time.Duration { return time.Duration(sec * float64(time.Second)) }
	burst := func(sec float64, n int) []admission.Span {
		var out []admission.Span
		for range n {
			out = append(out, admission.Span{From: at(sec), To: at(sec), Cost: 1})
		}
		return out
	}
	cat := func(ss ...[]admission.Span) []admission.Span { return slices.Concat(ss...) }
	for _, tc := range []struct {
		name  string
		tl    timeline
		spans []admission.Span
		over  float64 // the verdict's overshoot
	}{
		{"within the burst", timeline{initial: s("redis", 10, 0)}, burst(1, 10), -0},
		{"over the burst", timeline{initial: s("redis", 10, 0)}, burst(1, 13), 3},
		{"a span that may lie outside the window is not counted in it",
			timeline{initial: s("redis", 10, 1)},
			cat(burst(1, 10), []admission.Span{{From: 0, To: at(4), Cost: 3}}), 0},
		{"a grown rule allows its new burst at once",
			timeline{initial: s("redis", 10, 0), changes: []change{{At: at(1), From: s("redis", 10, 0), To: s("redis", 20, 0)}}, linger: at(1)},
			burst(1.5, 20), 0},
		{"a shrunk rule keeps its old burst while it lingers",
			timeline{initial: s("redis", 20, 0), changes: []change{{At: at(1), From: s("redis", 20, 0), To: s("redis", 10, 0)}}, linger: at(1)},
			cat(burst(1.5, 20)), 0},
		{"and not after",
			timeline{initial: s("redis", 20, 0), changes: []change{{At: at(1), From: s("redis", 20, 0), To: s("redis", 10, 0)}}, linger: at(1)},
			cat(burst(2.5, 12)), 2},
		{"a window over a shrink is judged by the old shape",
			timeline{initial: s("redis", 20, 0), changes: []change{{At: at(1), From: s("redis", 20, 0), To: s("redis", 10, 0)}}, linger: at(1)},
			cat(burst(0.5, 15), burst(2.5, 10)), 5},
		{"a mode switch allows one more burst",
			timeline{initial: s("redis", 10, 0), changes: []change{{At: at(1), From: s("redis", 10, 0), To: s("auto", 10, 0)}}, linger: at(1)},
			cat(burst(0.5, 10), burst(1.5, 10)), 0},
		{"and no more",
			timeline{initial: s("redis", 10, 0), changes: []change{{At: at(1), From: s("redis", 10, 0), To: s("auto", 10, 0)}}, linger: at(1)},
			cat(burst(0.5, 10), burst(1.5, 11)), 1},
		{"a switch allows nothing in windows it is not in",
			timeline{initial: s("redis", 10, 0), changes: []change{{At: at(1), From: s("redis", 10, 0), To: s("auto", 10, 0)}}, linger: at(1)},
			cat(burst(3, 12)), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := judge(tc.tl, tc.spans)
			if math.Abs(v.Over-tc.over) > 1e-9 && !(tc.over <= 0 && v.Over <= 0) {
				t.Fatalf("overshoot %v in [%v, %v] (B %v r %v, %d switches), want %v", v.Over, v.From, v.To, v.Burst, v.Rate, v.Switches, tc.over)
			}
		})
	}
}
