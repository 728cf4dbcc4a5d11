package bucket_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
)

const t0 = int64(1_700_000_000_000_000) // µs since the epoch, late 2023

// fakeClock is a manual µs clock.
type fakeClock struct{ now atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.now.Store(t0)
	return c
}

func (c *fakeClock) Now() int64              { return c.now.Load() }
func (c *fakeClock) Advance(d time.Duration) { c.now.Add(int64(d / time.Microsecond)) }

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	runStoreSuite(t, func(t *testing.T) *fixture {
		clock := newFakeClock()
		m := bucket.NewMemoryStore(clock.Now)
		return &fixture{
			store: m,
			wait:  clock.Advance,
			held:  func(_ *testing.T, key string) bool { return m.Holds(key) },
		}
	})
}

func TestMemoryStoreExpiry(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	m := bucket.NewMemoryStore(clock.Now)
	l := bucket.Limit{Burst: 10, Rate: 4} // full after 2.5s
	k := bucket.Key("expiry", "s")
	mustTake(t, m, bucket.Request{Key: k, Limit: l, Cost: 10, RequestID: "id"})

	// Not forgotten before it is full again, however often sweeps run.
	for _, d := range []time.Duration{time.Second, 1500 * time.Millisecond} {
		clock.Advance(d)
		m.SweepNow(k)
		if b, _ := m.Size(); b != 1 {
			t.Fatalf("after %v: %d buckets held, want 1", d, b)
		}
	}
	// Full (2.5s) plus the margin (1s): swept.
	clock.Advance(bucket.ExpiryMargin + time.Microsecond)
	m.SweepNow(k)
	if b, ids := m.Size(); b != 0 || ids != 1 {
		t.Fatalf("after time to full + margin: %d buckets, %d ids held; want 0 buckets, the id still", b, ids)
	}
	// The request id is remembered for its TTL, then forgotten.
	if res := mustTake(t, m, bucket.Request{Key: k, Limit: l, Cost: 10, RequestID: "id"}); !res.Replayed || res.Now != t0 {
		t.Fatalf("id replay after bucket expiry = %+v, want the recorded decision", res)
	}
	clock.Advance(bucket.DefaultRequestIDTTL)
	m.SweepNow(k)
	if _, ids := m.Size(); ids != 0 {
		t.Fatalf("%d ids held after their TTL, want 0", ids)
	}

	// Rate 0 is kept forever.
	k0 := bucket.Key("expiry", "fixed")
	mustTake(t, m, bucket.Request{Key: k0, Limit: bucket.Limit{Burst: 1, Rate: 0}, Cost: 1})
	clock.Advance(24 * 365 * time.Hour)
	m.SweepNow(k0)
	if res := mustTake(t, m, bucket.Request{Key: k0, Limit: bucket.Limit{Burst: 1, Rate: 0}, Cost: 1}); res.Allowed {
		t.Fatalf("rate-0 bucket forgotten after a year: %+v", res)
	}
}

func TestMemoryStoreClockBackwards(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	m := bucket.NewMemoryStore(clock.Now)
	mod := newModel(bucket.Limit{Burst: 10, Rate: 1000})
	k := bucket.Key("clock", "s")
	mod.check(t, mustTake(t, m, bucket.Request{Key: k, Limit: mod.l, Cost: 6}), 6)
	clock.Advance(-5 * time.Second)
	got := mustTake(t, m, bucket.Request{Key: k, Limit: mod.l, Cost: 1})
	mod.check(t, got, 1)
	if got.Remaining != 3 || mod.st.Last != t0 {
		t.Errorf("take after the clock stepped back 5s = %+v (last %d); want 3 left, no refill, last kept at %d", got, mod.st.Last, t0)
	}
}
