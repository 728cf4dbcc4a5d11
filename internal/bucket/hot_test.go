package bucket_test

import (
	"context"
	"math"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
)

// hotCheck runs the hot-key script (hot.lua) on a real redis-server next to
// the Go model (hot.go) and compares every reply and the stored state after
// every step: tokens, times, marks and epochs exactly; the rate estimate to
// 1e-9 (Lua's exp is C's, Go's is its own, so the last bit may differ: the
// model then carries on from the stored value).
type hotCheck struct {
	s      *bucket.RedisStore
	c      *redis.Client
	key    string
	l      bucket.Limit
	h      bucket.Hot
	st     bucket.HotState
	exists bool
	// deadline is when the key expires by the model, as of the last step
	// that wrote it (server clock, µs; 0 = never).
	deadline     int64
	pendingWrite bool
	pendingAt    int64
}

func (hc *hotCheck) take(f fataler, cost float64, heldFor int64) bucket.HotDecision {
	f.Helper()
	req := bucket.Request{Key: hc.key, Limit: hc.l, Cost: cost, Hot: &hc.h, HeldFor: heldFor}
	got, err := hc.s.HotTakeRaw(context.Background(), req)
	if err != nil {
		f.Fatalf("take %+v: %v", req, err)
	}
	var want bucket.HotDecision
	hc.st, want = bucket.ModelHotTakeHeld(hc.st, hc.exists, hc.l, hc.h, cost, heldFor, got.Now)
	hc.exists = true
	hc.wrote(!got.Leased, got.Now)
	if got.Allowed != want.Allowed || math.Float64bits(got.Tokens) != math.Float64bits(want.Tokens) ||
		got.Leased != want.Leased || got.Promotion != want.Promotion {
		f.Fatalf("take cost %v at %d:\n script %+v\n model  %+v\n model state %+v", cost, got.Now, got, want, hc.st)
	}
	hc.checkState(f, got.Now)
	return got
}

func (hc *hotCheck) mark(f fataler, m bucket.MarkRequest) bucket.MarkResult {
	f.Helper()
	m.Key, m.Limit = hc.key, hc.l
	var out [1]bucket.MarkOutcome
	hc.s.Mark(context.Background(), []bucket.MarkRequest{m}, out[:])
	if out[0].Err != nil {
		f.Fatalf("mark %+v: %v", m, out[0].Err)
	}
	got := out[0].Result
	var want bucket.MarkResult
	hc.st, want = bucket.HotMark(hc.st, hc.exists, m, got.Now)
	if got != want {
		f.Fatalf("mark %+v:\n script %+v\n model  %+v\n model state %+v", m, got, want, hc.st)
	}
	hc.wrote(got.Verdict != bucket.MarkGone, got.Now)
	hc.checkState(f, got.Now)
	return got
}

func (hc *hotCheck) refund(f fataler, cost float64) {
	f.Helper()
	req := bucket.Request{Key: hc.key, Limit: hc.l, Cost: cost, Hot: &hc.h}
	_, now, err := hc.s.RefundRaw(context.Background(), req)
	if err != nil {
		f.Fatalf("refund %+v: %v", req, err)
	}
	if hc.exists {
		hc.wrote(hc.st.LeasedUntil == 0, now)
		hc.st = bucket.HotRefund(hc.st, hc.l, cost, now)
	}
	hc.checkState(f, now)
}

// wrote notes whether a step at now wrote the key (so set its expiry).
func (hc *hotCheck) wrote(w bool, now int64) {
	hc.pendingWrite, hc.pendingAt = w, now
}

// checkState compares the stored hash with the model, and its expiry with
// the model's.
func (hc *hotCheck) checkState(f fataler, now int64) {
	f.Helper()
	ctx := context.Background()
	v, err := hc.c.HMGet(ctx, hc.key, "tokens", "last", "lu", "ep", "hr", "ht", "calm", "hd", "hu").Result()
	if err != nil {
		f.Fatalf("HMGET: %v", err)
	}
	if !hc.exists {
		if v[0] != nil {
			f.Fatalf("bucket stored but the model has none: %v", v)
		}
		return
	}
	if hc.pendingWrite {
		hc.deadline = 0
		if ttl := bucket.HotExpiresAfter(hc.st, hc.l, hc.pendingAt); ttl > 0 {
			hc.deadline = hc.pendingAt + ttl
		}
		hc.pendingWrite = false
	}
	if v[0] == nil && hc.deadline != 0 {
		// Gone: fine if its expiry has passed by now (a loaded machine can
		// stall longer than a short bucket's time to full between the
		// script and this read); the model then starts afresh, as the
		// script will.
		tm, err := hc.c.Time(ctx).Result()
		if err != nil {
			f.Fatalf("TIME: %v", err)
		}
		if tm.UnixMicro() < hc.deadline-3000 {
			f.Fatalf("bucket gone at %d, before its expiry at %d (state %+v)", tm.UnixMicro(), hc.deadline, hc.st)
		}
		hc.exists, hc.st, hc.deadline = false, bucket.HotState{}, 0
		return
	}
	num := func(i int) float64 {
		if v[i] == nil {
			return 0
		}
		x, err := strconv.ParseFloat(v[i].(string), 64)
		if err != nil {
			f.Fatalf("field %d = %q: %v", i, v[i], err)
		}
		return x
	}
	got := bucket.HotState{
		State:       bucket.State{Tokens: num(0), Last: int64(num(1)), Held: num(7), HeldUntil: int64(num(8))},
		LeasedUntil: int64(num(2)), Epoch: int64(num(3)), Rate: num(4), RateAt: int64(num(5)), Calm: int64(num(6)),
	}
	want := hc.st
	if math.Abs(got.Rate-want.Rate) > 1e-9*math.Max(1, math.Abs(want.Rate)) {
		f.Fatalf("rate estimate: stored %v, model %v", got.Rate, want.Rate)
	}
	want.Rate = got.Rate // carry on from the stored value (see hotCheck)
	hc.st.Rate = got.Rate
	if got != want {
		f.Fatalf("stored state:\n script %+v\n model  %+v", got, want)
	}
	pttl, err := hc.c.PTTL(ctx, hc.key).Result()
	if err != nil {
		f.Fatalf("PTTL: %v", err)
	}
	// PEXPIRE is in whole ms, rounded up, on a clock Redis reads in whole
	// ms (and caches), and time passes before PTTL: a few ms either way.
	// The side that matters is never expiring while the model holds the
	// key (pttl > 0) nor holding it unbounded.
	if hc.deadline == 0 && pttl >= 0 || hc.deadline > 0 && (pttl <= 0 || pttl > time.Duration(hc.deadline-now+20_000)*time.Microsecond) {
		f.Fatalf("PTTL %v, model expiry at %d, now %d (state %+v)", pttl, hc.deadline, now, want)
	}
}

// TestHotScriptMatchesModel drives the hot-key script and the model through
// random takes, marks (right and wrong epochs, hot and cool counts),
// refunds and pauses long enough for holds to lapse.
func TestHotScriptMatchesModel(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t)
	s := bucket.NewRedisStore(openRedis(t, srv.Addr, testTimeout), bucket.RedisOptions{Timeout: testTimeout})
	var run atomic.Int64
	rapid.Check(t, func(rt *rapid.T) {
		hc := &hotCheck{
			s: s, c: srv.Client(),
			key: bucket.Key("hot", strconv.FormatInt(run.Add(1), 10)),
			l: bucket.Limit{
				Burst: rapid.SampledFrom([]float64{1, 3, 10, 1000}).Draw(rt, "burst"),
				Rate:  rapid.SampledFrom([]float64{0.5, 10, 1000, 1e6}).Draw(rt, "rate"),
			},
			h: bucket.Hot{
				PromoteAbove: rapid.SampledFrom([]float64{1, 50, 500, 1e5}).Draw(rt, "promote_above"),
				Hold:         rapid.Int64Range(200, 20_000).Draw(rt, "hold µs"),
				Tau:          rapid.SampledFrom([]int64{1_000, 10_000, 1_000_000}).Draw(rt, "tau µs"),
			},
		}
		cost := func() float64 {
			return rapid.SampledFrom([]float64{hc.l.Burst, 1, hc.l.Burst / 3}).Draw(rt, "cost")
		}
		steps := rapid.IntRange(1, 40).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			switch op := rapid.IntRange(0, 9).Draw(rt, "op"); {
			case op <= 2:
				hc.take(rt, cost(), 0)
			case op <= 4:
				// held takes: held past the sleeps below, or within one
				hc.take(rt, cost(), rapid.Int64Range(1, 40_000).Draw(rt, "held for µs"))
			case op <= 6:
				epoch := hc.st.Epoch
				if rapid.IntRange(0, 4).Draw(rt, "wrong epoch") == 0 {
					epoch++
				}
				if epoch <= 0 {
					epoch = 1
				}
				hc.mark(rt, bucket.MarkRequest{
					Epoch: epoch, Count: rapid.SampledFrom([]float64{0, 1, 100, 1e4}).Draw(rt, "count"),
					Hold: hc.h.Hold, Tau: hc.h.Tau,
					DemoteBelow: rapid.SampledFrom([]float64{0, 1, 100, 1e6}).Draw(rt, "demote_below"),
				})
			case op == 7:
				hc.refund(rt, cost())
			case op == 8:
				time.Sleep(time.Duration(rapid.IntRange(0, 25_000).Draw(rt, "sleep µs")) * time.Microsecond)
			case op == 9:
				hc.h.PromoteAbove = rapid.SampledFrom([]float64{1, 50, 500, 1e5}).Draw(rt, "promote_above")
			}
		}
	})
}

// TestHotPromoteMarkLapse walks one key through its life on a real Redis:
// decided while cool, promoted by a burst of decisions, "leased" while the
// mark is live and extended, cool marks not extending it, and back on the
// bucket (empty) once it lapses, with no second promotion for one hold.
func TestHotPromoteMarkLapse(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t)
	s := bucket.NewRedisStore(openRedis(t, srv.Addr, testTimeout), bucket.RedisOptions{Timeout: testTimeout})
	for _, store := range []struct {
		name string
		s    interface {
			Take(context.Context, bucket.Request) (bucket.Result, error)
			Mark(context.Context, []bucket.MarkRequest, []bucket.MarkOutcome)
		}
	}{{"redis", s}, {"memory", bucket.NewMemoryStore(nil)}} {
		t.Run(store.name, func(t *testing.T) {
			ctx := context.Background()
			l := bucket.Limit{Burst: 100, Rate: 10}
			hold := int64(300_000)
			h := &bucket.Hot{PromoteAbove: 50, Hold: hold, Tau: 1_000_000}
			req := bucket.Request{Key: bucket.Key("life", store.name), Limit: l, Cost: 1, Hot: h}
			var promo bucket.Promotion
			admitted := 0
			for i := 0; i < 200 && promo.Epoch == 0; i++ {
				res, err := store.s.Take(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				if res.Leased {
					t.Fatalf("decision %d answered leased before any promotion was reported", i)
				}
				if res.Allowed {
					admitted++
				}
				promo = res.Promotion
			}
			// 50/s with tau 1s: the 51st decision within a few ms crosses it.
			if promo.Epoch == 0 || admitted < 45 || admitted > 60 {
				t.Fatalf("after a burst: promotion %+v, %d admitted; want a promotion after about 50", promo, admitted)
			}
			res, err := store.s.Take(ctx, req)
			if err != nil || !res.Leased || res.Promotion.Epoch != promo.Epoch || res.Allowed {
				t.Fatalf("take while promoted = %+v, %v; want leased, epoch %d", res, err, promo.Epoch)
			}
			mark := func(epoch int64, count, demote float64) bucket.MarkResult {
				t.Helper()
				var out [1]bucket.MarkOutcome
				store.s.Mark(ctx, []bucket.MarkRequest{{Key: req.Key, Limit: l, Epoch: epoch, Count: count, Hold: hold, Tau: h.Tau, DemoteBelow: demote}}, out[:])
				if out[0].Err != nil {
					t.Fatal(out[0].Err)
				}
				return out[0].Result
			}
			if r := mark(promo.Epoch+1, 10, 1); r.Verdict != bucket.MarkGone {
				t.Fatalf("mark of another epoch = %+v, want gone", r)
			}
			if r := mark(promo.Epoch, 100, 1); r.Verdict != bucket.MarkKept || r.For < hold-1000 {
				t.Fatalf("hot mark = %+v, want kept for about %dµs", r, hold)
			}
			cool := mark(promo.Epoch, 0, 1e9)
			if cool.Verdict != bucket.MarkCool || cool.For <= 0 {
				t.Fatalf("cool mark = %+v, want cool, still live", cool)
			}
			time.Sleep(time.Duration(cool.For+20_000) * time.Microsecond)
			if r := mark(promo.Epoch, 100, 1); r.Verdict != bucket.MarkGone {
				t.Fatalf("mark after the lapse = %+v, want gone", r)
			}
			// Resumed empty as of the lapse (about r.For after the cool
			// mark): at 10/s only what refilled since then, never the 100 of
			// a full bucket; and no promotion within a hold of the lapse.
			lapse := cool.Now + cool.For
			time.Sleep(200 * time.Millisecond)
			n, last := 0, int64(0)
			for i := 0; i < 20; i++ {
				res, err := store.s.Take(ctx, req)
				if err != nil || res.Leased {
					t.Fatalf("take after the lapse = %+v, %v", res, err)
				}
				if res.Allowed {
					n++
				}
				last = res.Now
				if p := res.Promotion; p.Epoch != 0 {
					if p.Epoch < lapse+hold {
						t.Fatalf("promoted again at %d, within a hold (%dµs) of the lapse at %d", p.Epoch, hold, lapse)
					}
					break
				}
			}
			if most := int(float64(last-lapse)/1e6*l.Rate) + 1; n < 1 || n > most {
				t.Fatalf("admitted %d in the %dµs after the lapse; want 1 to %d (the refill since the lapse)", n, last-lapse, most)
			}
		})
	}
}
