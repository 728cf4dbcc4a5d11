package admission

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// The certain overshoot by brute force: every window [a, b] with a a From
// and b a To, counting the spans inside it.
func bruteCertain(spans []Span, burst, rate float64) float64 {
	best := -burst
	for _, x := range spans {
		for _, y := range spans {
			a, b := x.From, y.To
			if b < a {
				continue
			}
			var cost float64
			for _, s := range spans {
				if s.From >= a && s.To <= b {
					cost += s.Cost
				}
			}
			best = max(best, cost-burst-rate*(b-a).Seconds())
		}
	}
	return best
}

func TestCertainOvershootMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := range 300 {
		var spans []Span
		for range 1 + r.IntN(40) {
			from := ms(float64(r.IntN(2000)))
			spans = append(spans, Span{From: from, To: from + ms(float64(r.IntN(300))), Cost: float64(1 + r.IntN(3))})
		}
		burst, rate := float64(r.IntN(10)), float64(r.IntN(20))
		got := CertainOvershoot(spans, burst, rate)
		if want := bruteCertain(spans, burst, rate); math.Abs(got.Overshoot-want) > 1e-9 {
			t.Fatalf("case %d: CertainOvershoot = %v, brute force %v (spans %v, B %v, r %v)", n, got.Overshoot, want, spans, burst, rate)
		}
	}
}

// With exact times (From == To) it is the leaky-bucket overshoot of Check.
func TestCertainOvershootExactTimesIsCheck(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for n := range 200 {
		var recs []Record
		var spans []Span
		at := time.Duration(0)
		for range 1 + r.IntN(100) {
			at += ms(float64(r.IntN(50)))
			cost := float64(1 + r.IntN(2))
			recs = append(recs, Record{At: at, Cost: cost, Allowed: true})
			spans = append(spans, Span{From: at, To: at, Cost: cost})
		}
		burst, rate := float64(1+r.IntN(10)), float64(r.IntN(100))
		rep := Check(recs, "", burst, rate)
		got := CertainOvershoot(spans, burst, rate)
		if math.Abs(got.Overshoot-rep.Overshoot) > 1e-9 || math.Abs(rep.Certain.Overshoot-rep.Overshoot) > 1e-9 {
			t.Fatalf("case %d: certain %v (in Check %v), leaky bucket %v", n, got.Overshoot, rep.Certain.Overshoot, rep.Overshoot)
		}
	}
}

// Answers that arrive together after being decided apart are not an
// overshoot; a real one is found whatever the latencies of other
// admissions in the run.
func TestCertainOvershootPerAdmissionSlack(t *testing.T) {
	// B = 1, r = 10/s: one admission per 100ms. Ten admissions sent 100ms
	// apart, all answered at once at 1s (a stalled reply path).
	var bunched []Span
	for i := range 10 {
		bunched = append(bunched, Span{From: ms(float64(100 * i)), To: ms(1000), Cost: 1})
	}
	if c := CertainOvershoot(bunched, 1, 10); c.Overshoot > 1e-9 {
		t.Errorf("answers bunched on arrival: certain overshoot %v, want <= 0 (they may have been decided 100ms apart)", c.Overshoot)
	}
	// One slow admission early in the run (a cold start: 2s), then a real
	// overshoot of 5 within 10ms. A run-wide slack (r x 2s = 20) would
	// excuse it; per admission it stands.
	spans := []Span{{From: 0, To: ms(2000), Cost: 1}}
	for range 6 {
		spans = append(spans, Span{From: ms(5000), To: ms(5010), Cost: 1})
	}
	c := CertainOvershoot(spans, 1, 10)
	if math.Abs(c.Overshoot-(6-1-0.1)) > 1e-9 || c.From != ms(5000) || c.To != ms(5010) {
		t.Errorf("certain overshoot %v in [%v, %v], want 4.9 in [5s, 5.01s]", c.Overshoot, c.From, c.To)
	}
	if c := CertainOvershoot(nil, 3, 1); c.Overshoot != -3 || c.Count != 0 {
		t.Errorf("no admission: %+v, want overshoot -3", c)
	}
}

// Judge uses the certain overshoot: a run's one slow decision no longer
// loosens every window.
func TestJudgeSlackIsPerAdmission(t *testing.T) {
	recs := []Record{{At: ms(2000), Latency: ms(2000), Quota: "q", Cost: 1, Allowed: true}}
	for range 6 {
		recs = append(recs, Record{At: ms(5010), Latency: ms(10), Quota: "q", Cost: 1, Allowed: true})
	}
	v := Judge(Check(recs, "q", 1, 10), 0)
	if v.Pass || v.Slack < 20 || math.Abs(v.Certain.Overshoot-4.9) > 1e-9 {
		t.Fatalf("Judge = pass %v, certain %v, run-wide slack %v; want a failure of 4.9 despite a slack of 20", v.Pass, v.Certain.Overshoot, v.Slack)
	}
}
