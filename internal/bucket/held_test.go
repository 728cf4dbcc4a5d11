package bucket_test

import (
	"context"
	"fmt"
	"math"
	"sort"
	"testing"

	"pgregory.net/rapid"

	"github.com/ration-dev/ration/internal/bucket"
)

// admission is tokens admitted at a time (µs): by the bucket directly, or
// spent later by whoever holds a held take (Envoy under an RLQS
// assignment).
type admission struct {
	at     int64
	tokens float64
}

// heldTaker is one store's take, on a clock the test sets.
type heldTaker func(cost float64, heldFor, now int64) (allowed bool)

// TestHeldTakesKeepEveryWindow: direct takes and held takes on one
// bucket, each held take's cost spent by its holder at any one moment
// before its hold ends (the adversary picks it), keep every window
// [a, b] within B + r(b - a). It runs the reference model, the memory
// store (the -dev store and the agents' emergency buckets) and the memory
// store's hot-key buckets (mode auto); the Redis scripts are the model
// bit for bit (TestScriptMatchesModel, TestHotScriptMatchesModel).
func TestHeldTakesKeepEveryWindow(t *testing.T) {
	t.Parallel()
	stores := []struct {
		name string
		make func(l bucket.Limit, clock *int64) heldTaker
	}{
		{"model", func(l bucket.Limit, _ *int64) heldTaker {
			var s bucket.State
			exists := false
			return func(cost float64, heldFor, now int64) bool {
				var r bucket.Result
				s, r = bucket.TakeHeld(s, exists, l, cost, heldFor, now)
				exists = true
				return r.Allowed
			}
		}},
		{"memory", func(l bucket.Limit, clock *int64) heldTaker {
			m := bucket.NewMemoryStore(func() int64 { return *clock })
			return func(cost float64, heldFor, _ int64) bool {
				r, err := m.Take(context.Background(), bucket.Request{Key: "k", Limit: l, Cost: cost, HeldFor: heldFor})
				if err != nil {
					panic(err)
				}
				return r.Allowed
			}
		}},
		{"memory hot", func(l bucket.Limit, clock *int64) heldTaker {
			m := bucket.NewMemoryStore(func() int64 { return *clock })
			h := &bucket.Hot{PromoteAbove: bucket.MaxValue, Hold: 1_000_000, Tau: 1_000_000}
			return func(cost float64, heldFor, _ int64) bool {
				r, err := m.Take(context.Background(), bucket.Request{Key: "k", Limit: l, Cost: cost, HeldFor: heldFor, Hot: h})
				if err != nil {
					panic(err)
				}
				return r.Allowed
			}
		}},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			rapid.Check(t, func(rt *rapid.T) {
				l := bucket.Limit{
					Burst: rapid.SampledFrom([]float64{1, 5, 10, 100}).Draw(rt, "burst"),
					Rate:  rapid.SampledFrom([]float64{0, 1, 10, 1000}).Draw(rt, "rate"),
				}
				if st.name == "memory hot" && l.Rate == 0 {
					l.Rate = 1 // a hot-key bucket needs a rate
				}
				now := t0
				take := st.make(l, &now)
				var adm []admission
				for i, n := 0, rapid.IntRange(1, 60).Draw(rt, "steps"); i < n; i++ {
					now += rapid.OneOf(rapid.Just(int64(0)), rapid.Int64Range(0, 3_000_000)).Draw(rt, "wait µs")
					cost := rapid.Float64Range(0.1, 1).Draw(rt, "cost fraction") * l.Burst
					var heldFor int64
					if rapid.Bool().Draw(rt, "held") {
						heldFor = rapid.Int64Range(1, 5_000_000).Draw(rt, "held for µs")
					}
					if !take(cost, heldFor, now) {
						continue
					}
					at := now
					if heldFor > 0 {
						// spent at once, at the hold's last moment, or
						// anywhere between
						at += rapid.SampledFrom([]int64{0, heldFor - 1, rapid.Int64Range(0, heldFor-1).Draw(rt, "spent after µs")}).Draw(rt, "spent at")
					}
					adm = append(adm, admission{at, cost})
				}
				if a, b, sum, ok := worstWindow(adm, l); !ok {
					rt.Fatalf("admitted %v in [%d, %d] (%d µs): over B + r*T = %v", sum, a, b, b-a, l.Burst+l.Rate*float64(b-a)/1e6)
				}
			})
		})
	}
}

// worstWindow checks every window between two admissions: the tokens
// admitted in [a, b] are at most B + r(b - a) (up to float rounding). It
// returns the first window over it.
func worstWindow(adm []admission, l bucket.Limit) (a, b int64, sum float64, ok bool) {
	sort.Slice(adm, func(i, j int) bool { return adm[i].at < adm[j].at })
	for i := range adm {
		sum = 0
		for j := i; j < len(adm); j++ {
			sum += adm[j].tokens
			bound := l.Burst + l.Rate*float64(adm[j].at-adm[i].at)/1e6
			if sum > bound*(1+1e-9) {
				return adm[i].at, adm[j].at, sum, false
			}
		}
	}
	return 0, 0, 0, true
}

// TestHeldTakeStopsRefillBehindIt walks the example the hold exists for:
// an RLQS assignment takes the whole burst, the bucket refills while
// Envoy has not spent it yet, and Envoy spends it all at the hold's last
// moment: without the hold the bucket would be full again then, and the
// window around that moment would see twice the burst.
func TestHeldTakeStopsRefillBehindIt(t *testing.T) {
	l := bucket.Limit{Burst: 10, Rate: 10}
	const hold = 3_000_000 // 3s, in µs
	tests := []struct {
		name      string
		at        int64 // after the held take, µs
		cost      float64
		wantAllow bool
	}{
		{"during the hold: refilled to B - held only", 2_000_000, 0.5, false},
		{"at the hold's end: empty", hold, 0.5, false},
		{"past it: what refilled since", hold + 100_000, 1, true},
		{"past it: no more", hold + 100_000, 1.5, false},
		{"B/r after the hold: full", hold + 1_000_000, 10, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, r := bucket.TakeHeld(bucket.State{}, false, l, 10, hold, t0)
			if !r.Allowed || s.Held != 10 || s.HeldUntil != t0+hold {
				t.Fatalf("held take of the burst = %+v, %+v; want allowed, 10 held until %d", s, r, t0+hold)
			}
			_, r = bucket.Take(s, true, l, tt.cost, t0+tt.at)
			if r.Allowed != tt.wantAllow {
				t.Errorf("take %v at +%dµs: allowed %v, want %v (state after the held take %+v)", tt.cost, tt.at, r.Allowed, tt.wantAllow, s)
			}
		})
	}
}

// TestHeldRefundCappedBelowHeld: a refund cannot lift a bucket above
// B - held either.
func TestHeldRefundCappedBelowHeld(t *testing.T) {
	l := bucket.Limit{Burst: 10, Rate: 1}
	s, _ := bucket.TakeHeld(bucket.State{}, false, l, 4, 5_000_000, t0)
	s = bucket.Refund(s, l, 10, t0+1)
	if s.Tokens != 6 {
		t.Fatalf("after a refund of 10 while 4 are held: %v tokens, want 6", s.Tokens)
	}
	if got := fmt.Sprint(bucket.ExpiresAfter(s, l, t0+1)); got != fmt.Sprint(int64(5_000_000-1+10_000_000)+int64(bucket.ExpiryMargin.Microseconds())) {
		t.Fatalf("expires after %s µs; want counted from the hold's end", got)
	}
	if math.IsNaN(s.Tokens) {
		t.Fatal("NaN")
	}
}
