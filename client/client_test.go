package client_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ration-dev/ration/client"
)

func newClient(t *testing.T, addr string, opts client.Options) *client.Client {
	t.Helper()
	c, err := client.New(addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// frozenAgent is what a client sees of an agent process that is stopped
// (SIGSTOP, a debugger, a stalled host): the kernel completes TCP
// handshakes into the listen backlog, and nothing ever answers.
func frozenAgent(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// Answers are mapped field by field; INVALID_ARGUMENT is ErrInvalid; a
// batch's invalid item fails alone.
func TestDecisionsAndErrors(t *testing.T) {
	_, addr := startFake(t)
	c := newClient(t, addr, client.Options{})
	ctx := context.Background()

	d, err := c.Allow(ctx, req("alice"))
	want := client.Decision{Allowed: true, Rule: "alice", Limit: 5, Remaining: 4, Rate: 1, Reset: time.Second, Reason: client.ReasonOK}
	if err != nil || d != want || d.Status() != 200 {
		t.Fatalf("Allow = %+v, %v; want %+v", d, err, want)
	}
	d, err = c.Allow(ctx, req("over"))
	if err != nil || d.Allowed || d.Reason != client.ReasonOverLimit || d.RetryAfter != 1500*time.Millisecond || d.Reset != 5*time.Second || d.Status() != 429 {
		t.Fatalf("Allow over = %+v, %v; want over_limit, retry after 1.5s (429)", d, err)
	}
	if _, err := c.Allow(ctx, req("bad")); !errors.Is(err, client.ErrInvalid) || errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Allow bad = %v, want ErrInvalid", err)
	}

	ds, err := c.AllowBatch(ctx, []client.Request{req("a"), req("bad"), req("over")})
	if err != nil || len(ds) != 3 {
		t.Fatalf("AllowBatch = %v, %v", ds, err)
	}
	if !ds[0].Allowed || ds[0].Rule != "a" || ds[0].Err != nil {
		t.Errorf("batch[0] = %+v, want admitted", ds[0])
	}
	if ds[1].Reason != client.ReasonInvalid || !errors.Is(ds[1].Err, client.ErrInvalid) {
		t.Errorf("batch[1] = %+v, want invalid with ErrInvalid", ds[1])
	}
	if ds[2].Allowed || ds[2].Reason != client.ReasonOverLimit {
		t.Errorf("batch[2] = %+v, want over_limit", ds[2])
	}
}

// Options.BatchTimeout bounds AllowBatch, Options.Timeout the rest: a batch
// may take longer than a decision.
func TestBatchTimeoutIsItsOwn(t *testing.T) {
	f, addr := startFake(t)
	f.delay.Store(int64(300 * time.Millisecond))
	f.batchDelay.Store(int64(300 * time.Millisecond))
	ctx := context.Background()
	batch := []client.Request{req("a"), req("b")}

	short := newClient(t, addr, client.Options{Timeout: 50 * time.Millisecond, BatchTimeout: 10 * time.Second})
	if _, err := short.Allow(ctx, req("a")); !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Allow taking 300ms with Timeout 50ms = %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	if ds, err := short.AllowBatch(ctx, batch); err != nil || len(ds) != 2 {
		t.Errorf("AllowBatch taking 300ms with BatchTimeout 10s (Timeout 50ms) = %v, %v; want answers", ds, err)
	}

	shortBatch := newClient(t, addr, client.Options{Timeout: 10 * time.Second, BatchTimeout: 50 * time.Millisecond})
	if _, err := shortBatch.Allow(ctx, req("a")); err != nil {
		t.Errorf("Allow taking 300ms with Timeout 10s = %v, want an answer", err)
	}
	if _, err := shortBatch.AllowBatch(ctx, batch); !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("AllowBatch taking 300ms with BatchTimeout 50ms = %v, want ErrUnavailable and DeadlineExceeded", err)
	}

	// The defaults: a 300ms batch is within DefaultBatchTimeout, a 300ms
	// decision is not within DefaultTimeout.
	defaults := newClient(t, addr, client.Options{})
	if _, err := defaults.AllowBatch(ctx, batch); err != nil {
		t.Errorf("AllowBatch taking 300ms by default (%v) = %v, want answers", client.DefaultBatchTimeout, err)
	}
	if _, err := defaults.Allow(ctx, req("a")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Allow taking 300ms by default (%v) = %v, want DeadlineExceeded", client.DefaultTimeout, err)
	}
}

// Concurrent calls share one connection: the client dials once.
func TestOneConnectionForAllCalls(t *testing.T) {
	_, addr := startFake(t)
	var dials atomic.Int64
	dialer := func(ctx context.Context, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	// A generous timeout: 96 calls at once on one stream under -race on a
	// loaded machine outlast the default 250ms, and this test is about
	// dialling, not time.
	c := newClient(t, addr, client.Options{Timeout: 10 * time.Second, DialOptions: []grpc.DialOption{grpc.WithContextDialer(dialer)}})
	s := c.AllowStream(context.Background())
	defer s.Close()
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				if _, err := c.Allow(context.Background(), req("u")); err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
				if _, err := c.AllowBatch(context.Background(), []client.Request{req("u")}); err != nil {
					t.Errorf("AllowBatch: %v", err)
					return
				}
				if _, err := s.Allow(context.Background(), req("u")); err != nil {
					t.Errorf("Stream.Allow: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials for 480 concurrent calls, want 1 shared connection", n)
	}
}

// Every decision has a deadline: Options.Timeout (BatchTimeout for a
// batch), or the caller's if earlier.
func TestDeadlines(t *testing.T) {
	want := func(t *testing.T, what string, err error) {
		t.Helper()
		if !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s = %v; want ErrUnavailable and DeadlineExceeded", what, err)
		}
	}
	t.Run("Options.Timeout", func(t *testing.T) {
		c := newClient(t, frozenAgent(t), client.Options{Timeout: 100 * time.Millisecond})
		_, err := c.Allow(context.Background(), req("x"))
		want(t, "Allow", err)
	})
	t.Run("caller's deadline", func(t *testing.T) {
		c := newClient(t, frozenAgent(t), client.Options{Timeout: time.Hour, BatchTimeout: time.Hour})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := c.Allow(ctx, req("x"))
		want(t, "Allow", err)
		_, err = c.AllowBatch(ctx, []client.Request{req("x")})
		want(t, "AllowBatch", err)
	})
	t.Run("Options.BatchTimeout", func(t *testing.T) {
		c := newClient(t, frozenAgent(t), client.Options{Timeout: time.Hour, BatchTimeout: 100 * time.Millisecond})
		_, err := c.AllowBatch(context.Background(), []client.Request{req("x")})
		want(t, "AllowBatch", err)
	})
	t.Run("stream", func(t *testing.T) {
		c := newClient(t, frozenAgent(t), client.Options{Timeout: 100 * time.Millisecond})
		s := c.AllowStream(context.Background())
		defer s.Close()
		for i := 0; i < 2; i++ { // the second waits on the stream still opening
			start := time.Now()
			_, err := s.Allow(context.Background(), req("x"))
			want(t, "Stream.Allow", err)
			if el := time.Since(start); el > 5*time.Second {
				t.Fatalf("Stream.Allow took %v with Timeout 100ms", el)
			}
		}
	})
	t.Run("caller canceled", func(t *testing.T) {
		c := newClient(t, frozenAgent(t), client.Options{Timeout: time.Hour})
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		if _, err := c.Allow(ctx, req("x")); !errors.Is(err, context.Canceled) || errors.Is(err, client.ErrUnavailable) {
			t.Fatalf("Allow canceled = %v, want context.Canceled only", err)
		}
	})
}

// Nothing listening: calls fail at once with ErrUnavailable rather than
// wait for a connection.
func TestAgentUnreachable(t *testing.T) {
	c := newClient(t, closedAddr(t), client.Options{Timeout: time.Minute, BatchTimeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, client.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s to a closed port = %v, want ErrUnavailable without waiting for the deadline", what, err)
		}
	}
	_, err := c.Allow(ctx, req("x"))
	check("Allow", err)
	_, err = c.AllowBatch(ctx, []client.Request{req("x")})
	check("AllowBatch", err)
	s := c.AllowStream(ctx)
	defer s.Close()
	_, err = s.Allow(ctx, req("x"))
	check("Stream.Allow", err)
}

func TestNewRejectsNegativeTimeouts(t *testing.T) {
	if _, err := client.New("127.0.0.1:1", client.Options{Timeout: -time.Second}); err == nil {
		t.Error("New with a negative Timeout succeeded")
	}
	if _, err := client.New("127.0.0.1:1", client.Options{BatchTimeout: -time.Second}); err == nil {
		t.Error("New with a negative BatchTimeout succeeded")
	}
}
