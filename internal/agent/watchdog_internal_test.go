package agent

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// The watchdog's ring, on a fake clock: decisions shorter than the stall
// limit never wedge it, however many and however they overlap ticks; one
// that outlives the limit does, within the limit plus two ticks, and
// stays wedged for as long as it is in flight; once it ends, the agent is
// healthy again within one turn of the ring.
func TestWatchdogRing(t *testing.T) {
	cases := []struct {
		name       string
		stall      time.Duration
		hold       time.Duration // how long the long decision lasts
		wantWedged bool
	}{
		{"short decisions only", 3 * time.Second, 0, false},
		{"just under the limit", 3 * time.Second, 2 * time.Second, false},
		{"past the limit", 3 * time.Second, 10 * time.Second, true},
		{"limit not a multiple of the tick", 2500 * time.Millisecond, 10 * time.Second, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				changes := 0
				w := newWatchdog(tc.stall, time.Second, nil, slog.New(slog.DiscardHandler), func(bool) { changes++ })
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				go w.run(ctx)

				// Background traffic: decisions of 300ms, back to back.
				traffic := make(chan struct{})
				defer func() { cancel(); <-traffic }()
				go func() {
					defer close(traffic)
					for ctx.Err() == nil {
						e := w.begin()
						time.Sleep(300 * time.Millisecond)
						w.end(e)
					}
				}()
				var firstWedged time.Duration
				start := time.Now()
				if tc.hold > 0 {
					e := w.begin()
					deadline := start.Add(tc.hold)
					for time.Now().Before(deadline) {
						time.Sleep(100 * time.Millisecond)
						synctest.Wait()
						if w.wedged() != "" && firstWedged == 0 {
							firstWedged = time.Since(start)
						}
						if firstWedged > 0 && w.wedged() == "" {
							t.Fatalf("healthy again at %v while the decision is still in flight", time.Since(start))
						}
					}
					w.end(e)
				} else {
					time.Sleep(20 * time.Second)
					synctest.Wait()
				}
				if got := firstWedged > 0; got != tc.wantWedged {
					t.Fatalf("wedged = %v (first at %v), want %v", got, firstWedged, tc.wantWedged)
				}
				if tc.wantWedged && (firstWedged < tc.stall || firstWedged > tc.stall+2*time.Second) {
					t.Fatalf("wedged first at %v, want within [%v, %v]", firstWedged, tc.stall, tc.stall+2*time.Second)
				}
				// One turn of the ring after the end, healthy again.
				time.Sleep(tc.stall + 2*time.Second)
				synctest.Wait()
				if cause := w.wedged(); cause != "" {
					t.Fatalf("still wedged %v after the decision ended: %s", tc.stall+2*time.Second, cause)
				}
				if want := map[bool]int{false: 0, true: 2}[tc.wantWedged]; changes != want {
					t.Fatalf("%d state changes reported, want %d", changes, want)
				}
				cancel()
			})
		})
	}
}

// A lease loop that has not stepped for the stall limit wedges the agent;
// one that has never stepped (not started) does not.
func TestWatchdogLeaseLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var last atomic.Int64 // unix nanos, 0: never
		stepped := func() time.Time {
			if n := last.Load(); n != 0 {
				return time.Unix(0, n)
			}
			return time.Time{}
		}
		w := newWatchdog(3*time.Second, time.Second, stepped, slog.New(slog.DiscardHandler), nil)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go w.run(ctx)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if cause := w.wedged(); cause != "" {
			t.Fatalf("wedged before the loop ever stepped: %s", cause)
		}
		last.Store(time.Now().UnixNano())
		time.Sleep(4500 * time.Millisecond)
		synctest.Wait()
		if cause := w.wedged(); cause == "" {
			t.Fatal("not wedged 4.5s after the loop's last step, stall limit 3s")
		}
		last.Store(time.Now().UnixNano())
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		if cause := w.wedged(); cause != "" {
			t.Fatalf("wedged after the loop stepped again: %s", cause)
		}
		cancel()
	})
}
