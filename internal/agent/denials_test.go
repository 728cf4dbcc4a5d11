package agent

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/rules"
)

// A local denial never outlives the refill: whenever deniedUntilRefill
// denies a request, the store's own arithmetic (bucket.Take, the model the
// Lua script is checked against) denies it too, on the same bucket at any
// moment the store could be deciding it; its Retry-After is never longer
// than the store's. And it does deny what the store certainly denies
// (the slack aside), or the cache would save nothing.
func TestDeniedUntilRefillNeverOutlivesRefill(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		l := bucket.Limit{
			Burst: rapid.Float64Range(0.001, 1e6).Draw(rt, "burst"),
			Rate:  rapid.Float64Range(0.001, 1e6).Draw(rt, "rate"),
		}
		tokens := rapid.Float64Range(0, 1).Draw(rt, "fill") * l.Burst
		cost := rapid.Float64Range(0, 1.5).Draw(rt, "cost") * l.Burst
		// The store decided at its clock's t0 (after the send); this
		// request reaches it elapsed later, at the earliest. Its clock
		// counts whole microseconds.
		t0 := int64(1_700_000_000_000_000) + rapid.Int64Range(0, 1e6).Draw(rt, "t0")
		elapsed := time.Duration(rapid.Int64Range(0, int64(10*time.Second)).Draw(rt, "elapsed"))
		res, denied := deniedUntilRefill(tokens, l, cost, elapsed)
		st := bucket.State{Tokens: tokens, Last: t0}
		// Every clock reading the store could take for this request: from
		// elapsed after t0 (rounded down to its microsecond) on.
		at := t0 + int64(elapsed/time.Microsecond)
		_, model := bucket.Take(st, true, l, cost, at)
		if denied {
			if model.Allowed {
				rt.Fatalf("denied locally %v after a denial with %g of %+v left, cost %g; the store admits (%+v)", elapsed, tokens, l, cost, model)
			}
			if res.RetryAfter > model.RetryAfter {
				rt.Fatalf("local Retry-After %v, the store's %v: longer", res.RetryAfter, model.RetryAfter)
			}
			return
		}
		// Not denied locally: the store could admit it within the slack.
		_, late := bucket.Take(st, true, l, cost, t0+int64(slackened(elapsed)/time.Microsecond)+1)
		if !late.Allowed && cost <= l.Burst {
			rt.Fatalf("sent to the store although certainly denied: %g of %+v left %v ago, cost %g", tokens, l, elapsed, cost)
		}
	})
}

// The table: what is remembered and what is not, and when it is used.
func TestDenialsRememberOnlyWhatIsCertain(t *testing.T) {
	d := newDenials(4)
	rule := &rules.Rule{Name: "r", Mode: rules.ModeRedis}
	st := &step{rule: rule, req: bucket.Request{Key: "k", Limit: bucket.Limit{Burst: 10, Rate: 1}, Cost: 1}}
	d.record(st, bucket.Result{Allowed: false, Remaining: 0.5}, 1000)
	if _, ok := d.certain(st, 1000); !ok {
		t.Fatal("a denial with 0.5 of 1 token left, asked again at once: want it certain")
	}
	if _, ok := d.certain(st, 1000+int64(600*time.Millisecond)); ok {
		t.Fatal("asked 0.6s later at 1 token/s: the bucket may hold 1.1, want it sent")
	}
	if _, ok := d.certain(st, 1000+int64(490*time.Millisecond)); !ok {
		t.Fatal("asked 0.49s later at 1 token/s: the bucket holds at most 0.99 (slack aside), want it certain")
	}
	other := *st
	other.req.Limit.Burst = 20 // the rule was reloaded with another limit
	if _, ok := d.certain(&other, 1000); ok {
		t.Fatal("a denial under another limit: want it sent")
	}
	d.forget("k")
	if _, ok := d.certain(st, 1000); ok {
		t.Fatal("after this agent's refund of the bucket: want it sent")
	}
	for _, c := range []struct {
		name string
		edit func(*step)
	}{
		{"request id", func(s *step) { s.req.RequestID = "r1" }},
		{"rate 0", func(s *step) { s.req.Limit.Rate = 0 }},
		{"hot (mode auto)", func(s *step) { s.req.Hot = &bucket.Hot{} }},
		{"mode auto", func(s *step) { s.rule = &rules.Rule{Name: "a", Mode: rules.ModeAuto} }},
		{"shadow", func(s *step) { s.rule = &rules.Rule{Name: "s", Shadow: true} }},
	} {
		s := *st
		c.edit(&s)
		d.record(&s, bucket.Result{Allowed: false, Remaining: 0}, 1000)
		if _, ok := d.certain(&s, 1000); ok {
			t.Errorf("%s: a denial remembered, want none", c.name)
		}
	}
	if newDenials(0) != nil {
		t.Error("newDenials(0): want none (off)")
	}
}

// Once a denial lapses, one request asks the store again and the others
// wait for its answer: when it is a new denial, they are denied locally
// without asking. (In a flood from 64 callers, a lapse otherwise sent every
// request that arrived within a round trip to Redis.)
func TestLapsedDenialAskedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDenials(4)
		rule := &rules.Rule{Name: "r", Mode: rules.ModeRedis}
		req := bucket.Request{Key: "k", Limit: bucket.Limit{Burst: 10, Rate: 1}, Cost: 1}
		// Denied with nothing left 10s ago: lapsed (10 tokens refilled).
		d.record(&step{rule: rule, req: req}, bucket.Result{Remaining: 0}, sinceStart()-int64(10*time.Second))
		probe := step{rule: rule, req: req, path: pathRedis}
		if d.denyLocally(context.Background(), &probe, nil) || probe.probe == nil {
			t.Fatal("the first request after the lapse: want it sent to the store as the probe")
		}
		const waiters = 8
		var returned, denied atomic.Int32
		for range waiters {
			go func() {
				st := step{rule: rule, req: req, path: pathRedis}
				if d.denyLocally(context.Background(), &st, nil) {
					denied.Add(1)
				}
				returned.Add(1)
			}()
		}
		synctest.Wait()
		if n := returned.Load(); n != 0 {
			t.Fatalf("%d of %d requests went on before the probe's answer, want them waiting for it", n, waiters)
		}
		// The store denies the probe again (still short): the waiters are
		// denied locally.
		d.record(&probe, bucket.Result{Remaining: 0.2}, sinceStart())
		probed([]step{probe})
		synctest.Wait()
		if returned.Load() != waiters || denied.Load() != waiters {
			t.Fatalf("after the probe's denial: %d returned, %d denied locally; want all %d denied", returned.Load(), denied.Load(), waiters)
		}
	})
}

// certain answers st's request as the store would, when its denial is
// certain at now (sinceStart); ok false sends it to the store: what
// denyLocally decides, at a chosen time.
func (d *denials) certain(st *step, now int64) (res bucket.Result, ok bool) {
	if e := d.lookup(st); e != nil {
		return deniedUntilRefill(e.tokens, e.limit, st.req.Cost, time.Duration(now-e.sent))
	}
	return bucket.Result{}, false
}

// Two batches that each claimed the probe of one lapsed denial, then meet
// the other's, go on to the store: neither waits for a probe the other
// answers only after its own last step. (They waited for each other until
// their callers' deadlines: a -dev agent under load stalled every batch
// call of a bench run for its 5s timeout, and its /healthz failed.)
func TestBatchesHoldingProbesNeverWaitForEachOther(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDenials(4)
		rule := &rules.Rule{Name: "r", Mode: rules.ModeRedis}
		// The table's seed is random: two keys share a slot one time in
		// four, and the second denial recorded would evict the first.
		// The second key is the first one that lands in a slot of its own.
		y := "y"
		for i := 0; d.slot(y) == d.slot("x"); i++ {
			y = fmt.Sprintf("y%d", i)
		}
		reqs := map[string]bucket.Request{}
		for _, k := range []string{"x", y} {
			reqs[k] = bucket.Request{Key: k, Limit: bucket.Limit{Burst: 10, Rate: 1}, Cost: 1}
			d.record(&step{rule: rule, req: reqs[k]}, bucket.Result{Remaining: 0}, sinceStart()-int64(10*time.Second))
		}
		batch := func(first, second string) []step {
			return []step{{rule: rule, req: reqs[first], path: pathRedis}, {rule: rule, req: reqs[second], path: pathRedis}}
		}
		a, b := batch("x", y), batch(y, "x")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if d.denyLocally(ctx, &a[0], a) || a[0].probe == nil {
			t.Fatal("batch A's x: want it the probe")
		}
		if d.denyLocally(ctx, &b[0], b) || b[0].probe == nil {
			t.Fatal("batch B's y: want it the probe")
		}
		var returned atomic.Int32
		for _, s := range [][]step{a, b} {
			go func() {
				d.denyLocally(ctx, &s[1], s)
				returned.Add(1)
			}()
		}
		synctest.Wait()
		if n := returned.Load(); n != 2 {
			t.Fatalf("%d of 2 batches went on to the store; the others wait for a probe its holder answers only after them", n)
		}
	})
}
