package client_test

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/client"
)

// holdFirst makes the fake hold every unary call for d: the first Allow of
// an idle coalescing client goes out alone as one, and the calls made
// meanwhile wait for it (CoalesceDelay an hour), then go out together.
func holdFirst(f *fakeAgent, d time.Duration) client.Options {
	f.delay.Store(int64(d))
	return client.Options{Timeout: 30 * time.Second, CoalesceDelay: time.Hour}
}

// Concurrent callers share AllowBatch calls and each gets its own answer;
// an invalid request fails alone.
func TestCoalesceOwnAnswers(t *testing.T) {
	f, addr := startFake(t)
	c := newClient(t, addr, holdFirst(f, 100*time.Millisecond))
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			for i := range 20 {
				subject := fmt.Sprintf("g%d-%d", g, i)
				if i%7 == 3 {
					if _, err := c.Allow(context.Background(), req("bad")); !errors.Is(err, client.ErrInvalid) || errors.Is(err, client.ErrUnavailable) {
						t.Errorf("Allow(bad) = %v, want ErrInvalid", err)
					}
					continue
				}
				d, err := c.Allow(context.Background(), req(subject))
				if err != nil || !d.Allowed || d.Rule != subject || d.Remaining != 4 {
					t.Errorf("Allow(%s) = %+v, %v; want its own answer", subject, d, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if f.batches.Load() == 0 {
		t.Fatalf("%d unary calls and no AllowBatch for 1280 concurrent decisions: nothing coalesced", f.unaries.Load())
	}
	t.Logf("%d unary calls, %d batches", f.unaries.Load(), f.batches.Load())
}

// A caller whose context ends while its call waits returns at once with
// its context's error, and its request is never sent; the others are not
// held up, and one caller's deadline is not another's.
func TestCoalesceCallerGivesUp(t *testing.T) {
	f, addr := startFake(t)
	c := newClient(t, addr, holdFirst(f, time.Second))
	first := make(chan error, 1)
	go func() {
		_, err := c.Allow(context.Background(), req("first"))
		first <- err
	}()
	for f.unaries.Load() == 0 { // "first" is on the wire, held
		time.Sleep(time.Millisecond)
	}
	cctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		_, err := c.Allow(cctx, req("cancelled"))
		gone <- err
	}()
	dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer dcancel()
	waited := make(chan error, 1)
	go func() {
		_, err := c.Allow(dctx, req("short"))
		waited <- err
	}()
	time.Sleep(20 * time.Millisecond) // "cancelled" joins the queue (if not, it is not sent either)
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) || errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("cancelled caller: %v, want context.Canceled", err)
	}
	if err := <-waited; !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("caller past its deadline: %v, want ErrUnavailable wrapping DeadlineExceeded", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("first caller: %v", err)
	}
	if d, err := c.Allow(context.Background(), req("after")); err != nil || d.Rule != "after" {
		t.Fatalf("Allow after = %+v, %v", d, err)
	}
	for _, s := range []string{"cancelled", "short"} {
		if n := f.receivedOf(s); n != 0 {
			t.Errorf("%q reached the agent %d times; its caller gave up before it was sent", s, n)
		}
	}
}

// Close fails every waiting caller with ErrUnavailable ("client closed"),
// and every later one, and leaves no goroutine behind.
func TestCoalesceClose(t *testing.T) {
	f, addr := startFake(t)
	c, err := client.New(addr, holdFirst(f, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 32)
	var wg sync.WaitGroup
	for i := range cap(errs) {
		wg.Go(func() {
			_, err := c.Allow(context.Background(), req(fmt.Sprint("c", i)))
			errs <- err
		})
	}
	for f.unaries.Load() == 0 { // one on the wire, the others (mostly) waiting
		time.Sleep(time.Millisecond)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "clos") {
			t.Errorf("caller waiting at Close: %v, want ErrUnavailable saying the client closed", err)
		}
	}
	if _, err := c.Allow(context.Background(), req("late")); !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "client closed") {
		t.Errorf("Allow after Close: %v, want ErrUnavailable: client closed", err)
	}
	if n := f.batches.Load(); n != 0 {
		t.Errorf("%d batches sent; the waiting calls should have failed unsent", n)
	}
	waitNoGoroutine(t, "(*coalescer)")
}

// waitNoGoroutine waits until no goroutine's stack holds fn, failing the
// test if one still does after a generous while.
func waitNoGoroutine(t *testing.T, fn string) {
	t.Helper()
	var stacks string
	for range 500 {
		var b strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		if stacks = b.String(); !strings.Contains(stacks, fn) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("a goroutine in %s outlived Close:\n%s", fn, stacks)
}

// A negative CoalesceDelay turns coalescing off: every Allow is a unary
// call of its own.
func TestCoalesceOff(t *testing.T) {
	f, addr := startFake(t)
	f.delay.Store(int64(20 * time.Millisecond))
	c := newClient(t, addr, client.Options{Timeout: 30 * time.Second, CoalesceDelay: -1})
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			if d, err := c.Allow(context.Background(), req(fmt.Sprint("u", i))); err != nil || !d.Allowed {
				t.Errorf("Allow = %+v, %v", d, err)
			}
		})
	}
	wg.Wait()
	if b, u := f.batches.Load(), f.unaries.Load(); b != 0 || u != 32 {
		t.Fatalf("%d batches and %d unary calls, want 0 and 32", b, u)
	}
}

// Options out of range are refused.
func TestNewRejectsCoalesceOptions(t *testing.T) {
	for _, o := range []client.Options{{CoalesceMaxItems: -1}, {CoalesceMaxItems: client.MaxBatch + 1}, {CoalesceInFlight: -1}} {
		if c, err := client.New("127.0.0.1:1", o); err == nil {
			c.Close()
			t.Errorf("New(%+v) accepted", o)
		}
	}
}
