package bucket_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
)

// store is what every bucket store provides; runStoreSuite checks the
// contract against each.
type store interface {
	Take(context.Context, bucket.Request) (bucket.Result, error)
	TakeBatch(context.Context, []bucket.Request, []bucket.Outcome)
	Refund(context.Context, bucket.Request) error
	Ping(context.Context) error
}

var (
	_ store = (*bucket.RedisStore)(nil)
	_ store = (*bucket.MemoryStore)(nil)
)

// fixture is one store under test and the means to look inside it.
type fixture struct {
	store store
	// wait lets the store's clock move on by at least d (a fake clock is
	// advanced; Redis's is waited for).
	wait func(d time.Duration)
	// held reports whether the store holds anything for key: the bucket or
	// a request-id record.
	held func(t *testing.T, key string) bool
	// io counts operations that reached a server; nil for a store with none.
	io func() int64
}

// runStoreSuite checks the bucket contract (doc.go; docs/architecture.md,
// Redis path) against the stores newFixture makes. Expectations come from
// the reference model fed each Result's Now, the store's own clock reading,
// so they are exact for Redis's real clock too. Every subtest uses its own
// keys.
func runStoreSuite(t *testing.T, newFixture func(t *testing.T) *fixture) {
	ctx := context.Background()
	key := func(t *testing.T, subject string) string { return bucket.Key(t.Name(), subject) }

	t.Run("burst then deny", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		m := newModel(bucket.Limit{Burst: 5, Rate: 0})
		k := key(t, "s")
		for i := 0; i < 6; i++ {
			got := mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 1})
			m.check(t, got, 1)
			if want := i < 5; got.Allowed != want {
				t.Fatalf("take %d: allowed = %v, want %v", i+1, got.Allowed, want)
			}
		}
	})

	t.Run("retry after", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		m := newModel(bucket.Limit{Burst: 2, Rate: 4})
		k := key(t, "s")
		m.check(t, mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 2}), 2)
		got := mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 1})
		m.check(t, got, 1)
		// 1 token at 4/s is 250ms away, less what refilled meanwhile.
		if got.Allowed || got.RetryAfter <= 0 || got.RetryAfter > 250*time.Millisecond {
			t.Errorf("take on empty = %+v; want denied, retry after in (0, 250ms]", got)
		}
		if got.Reset <= got.RetryAfter || got.Reset > 500*time.Millisecond {
			t.Errorf("reset %v; want in (retry after %v, 500ms]", got.Reset, got.RetryAfter)
		}
	})

	t.Run("rate 0 is a fixed allowance", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		m := newModel(bucket.Limit{Burst: 3, Rate: 0})
		k := key(t, "s")
		for i := 0; i < 2; i++ {
			m.check(t, mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 1.5}), 1.5)
		}
		f.wait(20 * time.Millisecond)
		got := mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 1.5})
		m.check(t, got, 1.5)
		if want := (bucket.Result{Now: got.Now}); got != want {
			t.Errorf("exhausted fixed allowance = %+v, want %+v (no retry time, no reset)", got, want)
		}
	})

	t.Run("refill over time", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		m := newModel(bucket.Limit{Burst: 10, Rate: 1000}) // a token a millisecond
		k := key(t, "s")
		m.check(t, mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 10}), 10)
		f.wait(20 * time.Millisecond)
		got := mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 10})
		m.check(t, got, 10)
		if !got.Allowed {
			t.Errorf("take after 20ms refill = %+v; want allowed (full again)", got)
		}
		f.wait(2 * time.Millisecond)
		m.check(t, mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 1}), 1)
	})

	t.Run("cost above burst fails without I/O", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		k := key(t, "s")
		req := bucket.Request{Key: k, Limit: bucket.Limit{Burst: 10, Rate: 1}, Cost: 11, RequestID: "x"}
		ops := f.ops()
		if _, err := f.store.Take(ctx, req); !errors.Is(err, bucket.ErrCostExceedsBurst) {
			t.Errorf("Take(cost 11, burst 10) error = %v, want ErrCostExceedsBurst", err)
		}
		if err := f.store.Refund(ctx, req); !errors.Is(err, bucket.ErrCostExceedsBurst) {
			t.Errorf("Refund(cost 11, burst 10) error = %v, want ErrCostExceedsBurst", err)
		}
		out := make([]bucket.Outcome, 1)
		f.store.TakeBatch(ctx, []bucket.Request{req}, out)
		if !errors.Is(out[0].Err, bucket.ErrCostExceedsBurst) {
			t.Errorf("TakeBatch(cost 11, burst 10) error = %v, want ErrCostExceedsBurst", out[0].Err)
		}
		f.checkUntouched(t, ops, k)
	})

	t.Run("invalid input fails without I/O", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		k := key(t, "s")
		ok := bucket.Request{Key: k, Limit: bucket.Limit{Burst: 10, Rate: 1}, Cost: 1}
		tests := []struct {
			name   string
			modify func(*bucket.Request)
		}{
			{"cost 0", func(r *bucket.Request) { r.Cost = 0 }},
			{"cost negative", func(r *bucket.Request) { r.Cost = -1 }},
			{"cost NaN", func(r *bucket.Request) { r.Cost = math.NaN() }},
			{"cost +Inf", func(r *bucket.Request) { r.Cost = math.Inf(1) }},
			{"cost above MaxValue", func(r *bucket.Request) { r.Cost = bucket.MaxValue * 2 }},
			{"burst 0", func(r *bucket.Request) { r.Limit.Burst = 0 }},
			{"burst negative", func(r *bucket.Request) { r.Limit.Burst = -5 }},
			{"burst NaN", func(r *bucket.Request) { r.Limit.Burst = math.NaN() }},
			{"burst above MaxValue", func(r *bucket.Request) { r.Limit.Burst = bucket.MaxValue * 2 }},
			{"rate negative", func(r *bucket.Request) { r.Limit.Rate = -1 }},
			{"rate NaN", func(r *bucket.Request) { r.Limit.Rate = math.NaN() }},
			{"rate +Inf", func(r *bucket.Request) { r.Limit.Rate = math.Inf(1) }},
			{"rate above MaxValue", func(r *bucket.Request) { r.Limit.Rate = bucket.MaxValue * 2 }},
			{"empty key", func(r *bucket.Request) { r.Key = "" }},
			{"request id too long", func(r *bucket.Request) { r.RequestID = strings.Repeat("i", bucket.MaxRequestIDLen+1) }},
		}
		ops := f.ops()
		for _, tt := range tests {
			req := ok
			tt.modify(&req)
			if _, err := f.store.Take(ctx, req); !errors.Is(err, bucket.ErrInvalid) {
				t.Errorf("%s: Take error = %v, want ErrInvalid", tt.name, err)
			}
			if err := f.store.Refund(ctx, req); !errors.Is(err, bucket.ErrInvalid) {
				t.Errorf("%s: Refund error = %v, want ErrInvalid", tt.name, err)
			}
			out := make([]bucket.Outcome, 1)
			f.store.TakeBatch(ctx, []bucket.Request{req}, out)
			if !errors.Is(out[0].Err, bucket.ErrInvalid) {
				t.Errorf("%s: TakeBatch error = %v, want ErrInvalid", tt.name, out[0].Err)
			}
		}
		f.checkUntouched(t, ops, k)
		// The longest valid id is fine.
		ok.RequestID = strings.Repeat("i", bucket.MaxRequestIDLen)
		mustTake(t, f.store, ok)
	})

	t.Run("request id charges once", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		m := newModel(bucket.Limit{Burst: 5, Rate: 0})
		k := key(t, "s")
		first := mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 2, RequestID: "a"})
		m.check(t, first, 2)
		again := mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 2, RequestID: "a"})
		want := first
		want.Replayed = true
		if again != want {
			t.Errorf("repeated id: %+v, want the recorded %+v", again, want)
		}
		m.check(t, mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 2}), 2) // 1 left: charged once
		// A denial is recorded and replayed too, even once budget returns.
		denied := mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 3, RequestID: "b"})
		m.check(t, denied, 3)
		if denied.Allowed {
			t.Fatalf("take 3 of 1 allowed: %+v", denied)
		}
		mustRefund(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 4})
		m.refund(4, denied.Now)
		if got := mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 3, RequestID: "b"}); got.Allowed || !got.Replayed {
			t.Errorf("repeated denied id after a refund = %+v, want the recorded denial", got)
		}
		// Ids are per
		other := mustTake(t, f.store, bucket.Request{Key: key(t, "other"), Limit: m.l, Cost: 2, RequestID: "a"})
		if other.Replayed || other.Remaining != 3 {
			t.Errorf("same id on another bucket = %+v, want a fresh decision", other)
		}
	})

	t.Run("refund caps at burst", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		m := newModel(bucket.Limit{Burst: 5, Rate: 0})
		k := key(t, "s")
		m.check(t, mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 3}), 3)
		mustRefund(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 5})
		m.refund(5, m.st.Last)
		got := mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 5})
		m.check(t, got, 5)
		if !got.Allowed || got.Remaining != 0 {
			t.Errorf("take 5 after refund = %+v, want allowed with 0 left (refund capped at 5)", got)
		}
		// A missing bucket is full: a refund changes nothing and writes nothing.
		missing := key(t, "missing")
		mustRefund(t, f.store, bucket.Request{Key: missing, Limit: m.l, Cost: 1})
		if f.held(t, missing) {
			t.Errorf("refund to a missing bucket created it")
		}
	})

	t.Run("refund by request id credits once", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		m := newModel(bucket.Limit{Burst: 10, Rate: 0})
		k := key(t, "s")
		m.check(t, mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 4, RequestID: "x"}), 4)
		m.check(t, mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 4}), 4) // 2 left
		for i := 0; i < 3; i++ {
			mustRefund(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 4, RequestID: "x"})
		}
		m.refund(4, m.st.Last) // once: 6
		mustRefund(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 4, RequestID: "never-taken"})
		denied := mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 7, RequestID: "d"})
		m.check(t, denied, 7)
		mustRefund(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 7, RequestID: "d"}) // denied: nothing to give back
		got := mustTake(t, f.store, bucket.Request{Key: k, Limit: m.l, Cost: 6})
		m.check(t, got, 6)
		if !got.Allowed || got.Remaining != 0 {
			t.Errorf("take 6 = %+v, want allowed with 0 left: one refund of 4 on top of 2", got)
		}
	})

	t.Run("64 goroutines on one bucket admit exactly its burst", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		req := bucket.Request{Key: key(t, "hot"), Limit: bucket.Limit{Burst: 100, Rate: 0}, Cost: 1}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for g := 0; g < 64; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 4; i++ {
					res, err := f.store.Take(ctx, req)
					if err != nil {
						errs <- err
						return
					}
					if res.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("concurrent take: %v", err)
		}
		if got := admitted.Load(); got != 100 {
			t.Errorf("64 goroutines x 4 takes on burst 100 admitted %d, want 100", got)
		}
	})

	t.Run("TakeBatch matches Take", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		l := bucket.Limit{Burst: 4, Rate: 0}
		subjects := []string{"a", "b", "a", "c", "a", "a", "b", "a", "c", "c", "c", "c"}
		costs := []float64{1, 2, 1.5, 4, 1, 0.5, 2, 1, 1, 1, 1, 1}
		one := make([]bucket.Result, len(subjects))
		var batch []bucket.Request
		for i, s := range subjects {
			one[i] = mustTake(t, f.store, bucket.Request{Key: key(t, "one/"+s), Limit: l, Cost: costs[i]})
			batch = append(batch, bucket.Request{Key: key(t, "batch/"+s), Limit: l, Cost: costs[i]})
		}
		// An invalid request fails alone.
		batch = append(batch[:3], append([]bucket.Request{{Key: key(t, "batch/bad"), Limit: l, Cost: -1}}, batch[3:]...)...)
		out := make([]bucket.Outcome, len(batch)+1) // longer than needed is fine
		out[len(batch)] = bucket.Outcome{Err: errors.New("untouched")}
		f.store.TakeBatch(ctx, batch, out)
		if !errors.Is(out[3].Err, bucket.ErrInvalid) {
			t.Errorf("invalid request in batch: error %v, want ErrInvalid", out[3].Err)
		}
		if out[len(batch)].Err == nil {
			t.Errorf("TakeBatch wrote past len(reqs)")
		}
		got := append(append([]bucket.Outcome{}, out[:3]...), out[4:len(batch)]...)
		for i := range one {
			if got[i].Err != nil {
				t.Fatalf("batch[%d]: %v", i, got[i].Err)
			}
			g, w := got[i].Result, one[i]
			g.Now, w.Now = 0, 0
			if g != w {
				t.Errorf("request %d (%s cost %v): TakeBatch %+v, Take %+v", i, subjects[i], costs[i], g, w)
			}
		}
		// With refill, against the model at the store's clock.
		m := newModel(bucket.Limit{Burst: 3, Rate: 50})
		k := key(t, "refill")
		reqs := []bucket.Request{{Key: k, Limit: m.l, Cost: 2}, {Key: k, Limit: m.l, Cost: 2}, {Key: k, Limit: m.l, Cost: 1}}
		out = make([]bucket.Outcome, len(reqs))
		f.store.TakeBatch(ctx, reqs, out)
		for i, o := range out {
			if o.Err != nil {
				t.Fatalf("refill batch[%d]: %v", i, o.Err)
			}
			m.check(t, o.Result, reqs[i].Cost)
		}
		f.store.TakeBatch(ctx, nil, nil) // empty: nothing to do
	})

	t.Run("ping", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		if err := f.store.Ping(ctx); err != nil {
			t.Errorf("Ping = %v", err)
		}
	})
}

func (f *fixture) ops() int64 {
	if f.io == nil {
		return 0
	}
	return f.io()
}

// checkUntouched fails unless nothing reached the server since ops was
// read and nothing is held for key.
func (f *fixture) checkUntouched(t *testing.T, ops int64, key string) {
	t.Helper()
	if got := f.ops(); got != ops {
		t.Errorf("%d operations reached the server, want none", got-ops)
	}
	if f.held(t, key) {
		t.Errorf("state was written for %s", key)
	}
}

// model follows one bucket through the reference model.
type model struct {
	l      bucket.Limit
	st     bucket.State
	exists bool
}

func newModel(l bucket.Limit) *model { return &model{l: l} }

// check applies a take of cost at got.Now to the model and fails unless the
// store's result is exactly the model's.
func (m *model) check(t *testing.T, got bucket.Result, cost float64) {
	t.Helper()
	st, want := bucket.Take(m.st, m.exists, m.l, cost, got.Now)
	m.st, m.exists = st, true
	if got != want {
		t.Fatalf("take %v (limit %+v) = %+v, model says %+v", cost, m.l, got, want)
	}
}

// refund applies a refund at now (a store's refund reports no clock, so a
// test refunds only where refill cannot tell: rate 0, or a known now).
func (m *model) refund(cost float64, now int64) {
	if m.exists {
		m.st = bucket.Refund(m.st, m.l, cost, now)
	}
}

func mustTake(t *testing.T, s store, req bucket.Request) bucket.Result {
	t.Helper()
	res, err := s.Take(context.Background(), req)
	if err != nil {
		t.Fatalf("Take(%+v): %v", req, err)
	}
	return res
}

func mustRefund(t *testing.T, s store, req bucket.Request) {
	t.Helper()
	if err := s.Refund(context.Background(), req); err != nil {
		t.Fatalf("Refund(%+v): %v", req, err)
	}
}
