package goclient_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/client"
	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
)

const coalesceRules = `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 5
    rate: 1/h
`

// decided is the agent's ration_decisions_total, summed.
func decided(t *testing.T, srv *agent.Server) float64 {
	t.Helper()
	mfs, err := srv.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "ration_decisions_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

func user(name string) client.Request {
	return client.Request{Descriptors: map[string]string{"user": name}}
}

// 64 goroutines through one coalescing Client: every decision is the
// caller's own (each user's remaining tokens count down by one per
// admitted call, whatever batch it went in), invalid requests and callers
// whose context had ended fail alone and charge nothing, and callers with
// short deadlines get a decision or their deadline, nothing else.
func TestCoalescedDecisions(t *testing.T) {
	srv, _ := startAgent(t, coalesceRules)
	c := newClient(t, srv.GRPCAddr(), client.Options{Timeout: 10 * time.Second})
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			ctx := context.Background()
			me := user(fmt.Sprint("u", g))
			for i := range 7 {
				// Beside each call: an invalid one, one already cancelled
				// and one with a short deadline, on other users.
				if _, err := c.Allow(ctx, client.Request{Descriptors: me.Descriptors, Cost: -1}); !errors.Is(err, client.ErrInvalid) {
					t.Errorf("cost -1: %v, want ErrInvalid", err)
				}
				if _, err := c.Allow(cancelled, me); !errors.Is(err, context.Canceled) {
					t.Errorf("cancelled: %v, want context.Canceled", err)
				}
				sctx, scancel := context.WithTimeout(ctx, time.Duration(i)*100*time.Microsecond)
				if d, err := c.Allow(sctx, user(fmt.Sprint("short", g))); err != nil && !errors.Is(err, context.DeadlineExceeded) || err == nil && d.Rule != "per-user" {
					t.Errorf("short deadline: %+v, %v; want a decision or DeadlineExceeded", d, err)
				}
				scancel()
				d, err := c.Allow(ctx, me)
				switch {
				case err != nil:
					t.Errorf("user u%d call %d: %v", g, i, err)
					return
				case i < 5 && (!d.Allowed || d.Remaining != int64(4-i)):
					t.Errorf("user u%d call %d = %+v, want admitted with %d left", g, i, d, 4-i)
				case i >= 5 && (d.Allowed || d.Reason != client.ReasonOverLimit):
					t.Errorf("user u%d call %d = %+v, want over_limit", g, i, d)
				}
			}
		})
	}
	wg.Wait()
}

// A caller whose context is cancelled while its call waits to be sent
// is not charged: the call never leaves the client.
func TestCoalesceCancelledNotCharged(t *testing.T) {
	srv, _ := startAgent(t, coalesceRules)
	p := harness.NewProxy(t, srv.GRPCAddr())
	// Only a returning call sends what waits: the test, not a timer,
	// decides when the queue goes out.
	c := newClient(t, p.Addr(), client.Options{Timeout: 30 * time.Second, CoalesceDelay: time.Hour, CoalesceInFlight: 1})
	ctx := context.Background()
	if _, err := c.Allow(ctx, user("warm")); err != nil { // the connection is up
		t.Fatal(err)
	}
	before := decided(t, srv)
	p.Delay(harness.Downstream, 2*time.Second, 0) // answers are held two seconds
	first := make(chan error, 1)
	go func() {
		_, err := c.Allow(ctx, user("first"))
		first <- err
	}()
	for decided(t, srv) == before { // "first" is on the wire, its answer held
		time.Sleep(time.Millisecond)
	}
	bctx, cancel := context.WithCancel(ctx)
	gone := make(chan error, 1)
	go func() {
		_, err := c.Allow(bctx, user("bob"))
		gone <- err
	}()
	time.Sleep(50 * time.Millisecond) // bob's call joins the queue
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v, want context.Canceled", err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	p.Heal()
	// A call of bob's sent then would be on the wire now, and this one,
	// with one call in flight at most, would go after it.
	d, err := c.Allow(ctx, user("bob"))
	if err != nil || !d.Allowed || d.Remaining != 4 {
		t.Fatalf("bob's first decided call = %+v, %v; want admitted with 4 of 5 left (the cancelled call charged nothing)", d, err)
	}
}

// The agent restarts under 32 goroutines of calls: the calls on the wire
// fail with ErrUnavailable, none hangs or gets another's answer, and the
// calls after it are decided by the new agent on the same address.
func TestCoalesceAgentRestart(t *testing.T) {
	old, _ := startAgent(t, coalesceRules)
	p := harness.NewProxy(t, old.GRPCAddr())
	c := newClient(t, p.Addr(), client.Options{Timeout: 5 * time.Second})
	var ok, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// A user per call: every answer is an admission with 4 left.
				d, err := c.Allow(context.Background(), user(fmt.Sprintf("r%d-%d", g, i)))
				switch {
				case errors.Is(err, client.ErrUnavailable):
					failed.Add(1)
				case err != nil:
					t.Errorf("call: %v, want a decision or ErrUnavailable", err)
					return
				case !d.Allowed || d.Remaining != 4:
					t.Errorf("call = %+v, want admitted with 4 left", d)
					return
				default:
					ok.Add(1)
				}
			}
		})
	}
	waitFor := func(n int64, what string) {
		t.Helper()
		for range 3000 {
			if ok.Load() >= n {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		close(stop)
		wg.Wait()
		t.Fatalf("%s: %d decisions, want %d (%d failed)", what, ok.Load(), n, failed.Load())
	}
	waitFor(500, "before the restart")
	next, _ := startAgent(t, coalesceRules)
	p.Retarget(next.GRPCAddr()) // the connections to the old agent break
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = old.Shutdown(sctx)
	cancel()
	after := ok.Load()
	waitFor(after+500, "after the restart")
	close(stop)
	wg.Wait()
	t.Logf("%d decided, %d failed with ErrUnavailable", ok.Load(), failed.Load())
}
