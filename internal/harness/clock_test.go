package harness

import (
	"context"
	"testing"
	"time"
)

// A server on a RedisClock reads TIME at the machine's time plus the
// clock's offset, and sees a step at once, forward and back.
func TestRedisClockSteps(t *testing.T) {
	clock := NewRedisClock(t)
	r := StartRedis(t, WithClock(t, clock))
	ctx := context.Background()
	// offsetSeen is TIME minus the machine's time, taken around the call:
	// within the call's duration of the clock's offset.
	offsetSeen := func() (lo, hi time.Duration) {
		before := time.Now()
		at, err := r.Client().Time(ctx).Result()
		after := time.Now()
		if err != nil {
			t.Fatalf("TIME: %v", err)
		}
		return at.Sub(after), at.Sub(before)
	}
	for _, off := range []time.Duration{0, 10 * time.Second, -5 * time.Second, 1500 * time.Millisecond, 0} {
		clock.Set(off)
		if got := clock.Offset(); got != off {
			t.Fatalf("Offset() = %v after Set(%v)", got, off)
		}
		lo, hi := offsetSeen()
		// TIME is truncated to microseconds: allow a millisecond.
		if off < lo-time.Millisecond || off > hi+time.Millisecond {
			t.Fatalf("clock set %v ahead: the server's TIME is %v to %v ahead of the machine's", off, lo, hi)
		}
	}
	// A key's TTL runs on the same clock: a step past it ends the key.
	if err := r.Client().Set(ctx, "k", "v", 3*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	clock.Set(4 * time.Second)
	if n, err := r.Client().Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("a key with a 3s TTL after a 4s step forward: exists %d, %v; want gone", n, err)
	}
}
