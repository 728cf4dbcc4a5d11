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
	Global       bool // scope: global, leased from the global group by both regions
}

func (s shape) String() string {
	out := fmt.Sprintf("%s B %g r %g", s.Mode, s.Burst, s.Rate)
	if s.DefaultShare > 0 {
		out += fmt.Sprintf(" default_share %g", s.DefaultShare)
	}
	if s.Global {
		out += " scope global"
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
	// The store's faults, and the rule's auto.hold: what
	// docs/failure-policies.md (Redis failover) allows them.
	failovers []failover
	steps     []clockStep
	hold      time.Duration
}

// interval is a stretch of the run in which the same shapes may be in
// force: the largest burst and rate among them, and the mode switches
// whose reload is under way in it.
type interval struct {
	from, to  time.Duration // [from, to)
	burst     float64
	rate      float64
	switching []int // indexes into changes
	// Whether a shape of mode redis or auto may be in force: what the
	// store's faults can reach (leased rules never touch Redis).
	redis, auto bool
	// The least burst that may be in force: what the second judge holds
	// a refusal in the interval to.
	leastBurst float64
}

func (tl timeline) intervals() []interval {
	cuts := []time.Duration{0}
	for _, c := range tl.changes {
		cuts = append(cuts, c.At, c.At+tl.linger)
	}
	for _, f := range tl.failovers {
		cuts = append(cuts, f.Cut, f.Promoted, f.Promoted+tl.hold)
	}
	for _, s := range tl.steps {
		cuts = append(cuts, s.At)
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
		iv.leastBurst = math.Inf(1)
		for _, s := range possible {
			iv.leastBurst = min(iv.leastBurst, s.Burst)
			iv.burst = max(iv.burst, s.Burst)
			iv.rate = max(iv.rate, s.Rate)
			iv.redis = iv.redis || s.Mode == "redis"
			iv.auto = iv.auto || s.Mode == "auto"
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
	Store       int     // the store's failovers and clock steps allowed for
	Extra       float64 // what the switches and the store's faults allow
	Admitted    float64 // cost admitted in the window's pair of intervals
	Count       int
}

// judge holds one subject's admissions to the bound: for every window
// [a, b], the cost certainly admitted in it (admission.CertainOvershoot:
// each admission anywhere in its span) at most
//
//	B + r (b - a) + k (B + r lag) + store
//
// where B and r are the largest burst and rate the rule may have had in
// force anywhere in the window (a reload that grows a rule allows more at
// once; one that shrinks it still allows the old shape for tl.linger
// after the file changed), k the mode switches under way in it, and store
// what docs/failure-policies.md (Redis failover) allows the store's faults
// the window holds (storeAllowance). Each
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
		var redis, auto bool
		switches := map[int]bool{}
		for j := i; j < len(ivs); j++ {
			burst, rate = max(burst, ivs[j].burst), max(rate, ivs[j].rate)
			redis, auto = redis || ivs[j].redis, auto || ivs[j].auto
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
			store, n := tl.storeAllowance(ivs[i].from, ivs[j].to, redis, auto, burst, rate)
			extra += store
			c := admission.CertainOvershoot(in, burst, rate)
			if o := c.Overshoot - extra; o > worst.Over {
				worst = verdict{Over: o, From: c.From, To: c.To, Burst: burst, Rate: rate,
					Switches: len(switches), Store: n, Extra: extra, Admitted: c.Admitted, Count: c.Count}
			}
		}
	}
	return worst
}

// refusalVerdict is the second judge's verdict on one (rule, subject):
// its refusals of requests the budget still held (admission.SpanRefusals),
// and how many of them came in a steady stretch (no schedule event in the
// settle before the refusal's span, nor in it).
type refusalVerdict struct {
	admission.Refusals
	Steady int
}

// judgeRefusals holds one subject's refusals to the admitted history: a
// refusal is false when an exact token bucket of the rule's shape, fed
// the subject's admissions, would have admitted it. The rule's shape
// changes over a run, so the judge is lenient: the bucket drains at the
// least rate the rule had in the run, and each refusal is held to the
// least burst that may have been in force in its span (an old shape
// lingers after a reload, as for the first judge).
func judgeRefusals(tl timeline, adm, refused []admission.Span, events []time.Duration, settle time.Duration) refusalVerdict {
	ivs := tl.intervals()
	rate := tl.initial.Rate
	for _, c := range tl.changes {
		rate = min(rate, c.From.Rate, c.To.Rate)
	}
	burstOf := func(s admission.Span) float64 {
		b := math.Inf(1)
		for _, iv := range ivs {
			if iv.from <= s.To && s.From < iv.to {
				b = min(b, iv.leastBurst)
			}
		}
		return b
	}
	v := refusalVerdict{Refusals: admission.SpanRefusals(adm, refused, rate, burstOf)}
	for _, at := range v.At {
		// At is the refusal's answer, its span mostly milliseconds long.
		if !slices.ContainsFunc(events, func(e time.Duration) bool { return e > at-settle && e <= at }) {
			v.Steady++
		}
	}
	return v
}

// storeAllowance is what docs/failure-policies.md (Redis failover) allows
// the store's faults in the windows within [from, to), for a rule whose
// shapes there include mode redis or auto (a leased rule never touches
// Redis: nothing), with burst B and rate r:
//
//   - a failover that lost the writes of L (the replica's link cut to its
//     promotion): B + r L in a window across the promotion, as a Redis
//     bucket may admit again what the lost writes had spent; for a mode
//     auto rule B + r max(L, hold) in a window that holds the promotion or
//     any of the hold after it (the promotion's mark lost: agents spend
//     its lease for up to a hold while the new primary decides the subject
//     from its older state). A window wholly before the promotion holds
//     the old primary's history alone, one wholly after it (and after
//     the hold) the new one's: each is held to the plain bound;
//   - a forward step of the store's clock by d (the primary's, or a
//     promotion of a replica whose clock runs ahead): r d in a window
//     that holds it, as a bucket refills early and a mark ends early by
//     d.
//
// It returns the allowance and how many faults it is for.
func (tl timeline) storeAllowance(from, to time.Duration, redis, auto bool, burst, rate float64) (float64, int) {
	if !redis && !auto {
		return 0, 0
	}
	var extra float64
	var n int
	for _, f := range tl.failovers {
		x := -1.0
		if from < f.Promoted && to > f.Promoted {
			x = (f.Promoted - f.Cut).Seconds()
		}
		if auto && from < f.Promoted+tl.hold && to > f.Promoted {
			x = max(x, tl.hold.Seconds())
		}
		if x >= 0 {
			extra += burst + rate*x
			n++
		}
	}
	for _, s := range tl.steps {
		if from < s.At && s.At < to {
			extra += rate * s.D.Seconds()
			n++
		}
	}
	return extra, n
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
		// A failover lost the writes of [1, 1.5]: B + r L = 10 + 4*0.5.
		{"a failover allows the old and the new primary's histories together",
			timeline{initial: s("redis", 10, 4), failovers: []failover{{Cut: at(1), Promoted: at(1.5)}}},
			cat(burst(1.2, 10), burst(1.6, 10)), 0},
		{"but not more than B on either side alone",
			timeline{initial: s("redis", 10, 4), failovers: []failover{{Cut: at(1), Promoted: at(1.5)}}},
			cat(burst(1.2, 12), burst(1.6, 10)), 2},
		{"nor after it",
			timeline{initial: s("redis", 10, 4), failovers: []failover{{Cut: at(1), Promoted: at(1.5)}}},
			cat(burst(2, 10), burst(2.1, 2)), 1.6},
		{"nor for a leased rule",
			timeline{initial: s("leased", 10, 4), failovers: []failover{{Cut: at(1), Promoted: at(1.5)}}},
			cat(burst(1.2, 10), burst(1.6, 10)), 8.4},
		{"an auto rule's lost mark: the old history a hold on",
			timeline{initial: s("auto", 10, 4), hold: at(2), failovers: []failover{{Cut: at(1), Promoted: at(1.5)}}},
			cat(burst(2, 10), burst(3, 10)), 0},
		{"a clock step forward by d allows r d",
			timeline{initial: s("redis", 10, 4), steps: []clockStep{{At: at(1), D: at(0.5)}}},
			cat(burst(0.9, 10), burst(1.1, 2)), 0},
		{"and no more",
			timeline{initial: s("redis", 10, 4), steps: []clockStep{{At: at(1), D: at(0.5)}}},
			cat(burst(0.9, 10), burst(1.1, 3)), 0.2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := judge(tc.tl, tc.spans)
			if math.Abs(v.Over-tc.over) > 1e-9 && !(tc.over <= 0 && v.Over <= 0) {
				t.Fatalf("overshoot %v in [%v, %v] (B %v r %v, %d switches), want %v", v.Over, v.From, v.To, v.Burst, v.Rate, v.Switches, tc.over)
			}
		})
	}
}

// What the store's faults allow a window, by hand: a failover only to a
// window across its promotion (B + r L), a mode auto rule's also to one
// within a hold after it (B + r max(L, hold)); a clock step to a window
// across it (r d); a leased rule nothing.
func TestStoreAllowance(t *testing.T) {
	at := func(sec float64) time.Duration { return time.Duration(sec * float64(time.Second)) }
	tl := timeline{hold: at(2), failovers: []failover{{Cut: at(1), Promoted: at(1.5)}},
		steps: []clockStep{{At: at(5), D: at(0.5)}}}
	for _, tc := range []struct {
		name        string
		from, to    float64
		redis, auto bool
		want        float64
		n           int
	}{
		{"redis, across the promotion", 0, 2, true, false, 10 + 4*0.5, 1},
		{"redis, before the promotion", 0, 1.5, true, false, 0, 0},
		{"redis, after it", 1.5, 3, true, false, 0, 0},
		{"auto, across the promotion", 0, 2, false, true, 10 + 4*2, 1},
		{"auto, within a hold after it", 1.5, 3, false, true, 10 + 4*2, 1},
		{"auto, past the hold", 3.5, 4, false, true, 0, 0},
		{"leased", 0, 10, false, false, 0, 0},
		{"redis, across the clock step", 4, 6, true, false, 4 * 0.5, 1},
		{"redis, after the clock step", 5, 6, true, false, 0, 0},
		{"redis, across both", 0, 6, true, false, 10 + 4*0.5 + 4*0.5, 2},
	} {
		got, n := tl.storeAllowance(at(tc.from), at(tc.to), tc.redis, tc.auto, 10, 4)
		if math.Abs(got-tc.want) > 1e-9 || n != tc.n {
			t.Errorf("%s: allowance %v for %d faults, want %v for %d", tc.name, got, n, tc.want, tc.n)
		}
	}
}
