package client_test

import (
	"context"
	"errors"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ration-dev/ration/client"
	"github.com/ration-dev/ration/client/clienttest"
	"github.com/ration-dev/ration/internal/harness"
)

const clientRules = `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 2
    rate: 1/h
`

func newClient(t *testing.T, addr string, opts client.Options) *client.Client {
	t.Helper()
	c, err := client.New(addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestAllowDecisions(t *testing.T) {
	srv, _ := startAgent(t, clientRules)
	c := newClient(t, srv.GRPCAddr(), client.Options{})
	ctx := context.Background()
	alice := client.Request{Descriptors: map[string]string{"user": "alice"}}
	for i := 0; i < 2; i++ {
		d, err := c.Allow(ctx, alice)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Reason != client.ReasonOK || d.Rule != "per-user" || d.Limit != 2 || d.Remaining != int64(1-i) || d.Status() != 200 {
			t.Fatalf("Allow %d = %+v, want admitted by per-user with %d left", i, d, 1-i)
		}
		if d.Rate <= 0 || d.Rate*3600 < 0.999 || d.Rate*3600 > 1.001 {
			t.Fatalf("Rate = %v, want 1/3600", d.Rate)
		}
	}
	d, err := c.Allow(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Reason != client.ReasonOverLimit || d.RetryAfter <= 0 || d.RetryAfter > time.Hour || d.Status() != 429 {
		t.Fatalf("3rd Allow = %+v, want over_limit with a retry within the hour (429)", d)
	}
	if d, err := c.Allow(ctx, client.Request{Descriptors: map[string]string{"other": "x"}}); err != nil || !d.Allowed || d.Reason != client.ReasonNoRule || d.Rule != "" {
		t.Fatalf("unmatched = %+v, %v; want admitted, no_rule", d, err)
	}
	// Cost above burst can never succeed: ErrInvalid, nothing charged.
	if _, err := c.Allow(ctx, client.Request{Descriptors: map[string]string{"user": "bob"}, Cost: 3}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("cost 3 of burst 2 = %v, want ErrInvalid", err)
	}
	// A batch: in order, an invalid item does not fail the others.
	ds, err := c.AllowBatch(ctx, []client.Request{
		{Descriptors: map[string]string{"user": "bob"}},
		{Descriptors: map[string]string{"user": "bob"}, Cost: -1},
		{Descriptors: map[string]string{"user": "bob"}, Cost: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !ds[0].Allowed || ds[0].Remaining != 1 {
		t.Fatalf("batch[0] = %+v, want admitted with 1 left (bob was not charged by the invalid call)", ds[0])
	}
	if ds[1].Reason != client.ReasonInvalid || !errors.Is(ds[1].Err, client.ErrInvalid) {
		t.Fatalf("batch[1] = %+v, want invalid with ErrInvalid", ds[1])
	}
	if ds[2].Allowed || ds[2].Reason != client.ReasonOverLimit {
		t.Fatalf("batch[2] = %+v, want over limit (2 > 1 left)", ds[2])
	}
}

// Concurrent calls share one connection: the client dials once.
func TestOneConnectionForAllCalls(t *testing.T) {
	srv, _ := startAgent(t, clientRules)
	var dials atomic.Int64
	dialer := func(ctx context.Context, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	c := newClient(t, srv.GRPCAddr(), client.Options{DialOptions: []grpc.DialOption{grpc.WithContextDialer(dialer)}})
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				if _, err := c.Allow(context.Background(), client.Request{Descriptors: map[string]string{"user": "u"}}); err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials for 160 concurrent calls, want 1 shared connection", n)
	}
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

// Every call has a deadline: Options.Timeout (BatchTimeout for a batch),
// or the caller's if earlier.
func TestDeadlines(t *testing.T) {
	req := client.Request{Descriptors: map[string]string{"user": "slow"}}
	t.Run("Options.Timeout", func(t *testing.T) {
		c := newClient(t, frozenAgent(t), client.Options{Timeout: 100 * time.Millisecond})
		if d, err := c.Allow(context.Background(), req); !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Allow = %+v, %v; want ErrUnavailable and DeadlineExceeded", d, err)
		}
	})
	t.Run("caller's deadline", func(t *testing.T) {
		c := newClient(t, frozenAgent(t), client.Options{Timeout: time.Hour})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if d, err := c.Allow(ctx, req); !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Allow = %+v, %v; want ErrUnavailable and DeadlineExceeded", d, err)
		}
	})
	t.Run("batch", func(t *testing.T) {
		c := newClient(t, frozenAgent(t), client.Options{Timeout: time.Hour, BatchTimeout: 100 * time.Millisecond})
		if _, err := c.AllowBatch(context.Background(), []client.Request{req}); !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("AllowBatch = %v, want ErrUnavailable and DeadlineExceeded", err)
		}
	})
	t.Run("stream", func(t *testing.T) {
		c := newClient(t, frozenAgent(t), client.Options{Timeout: 100 * time.Millisecond})
		s := c.AllowStream(context.Background())
		defer s.Close()
		for i := 0; i < 2; i++ { // the second waits on the stream still opening
			if _, err := s.Allow(context.Background(), req); !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Stream.Allow %d = %v, want ErrUnavailable and DeadlineExceeded", i, err)
			}
		}
	})
}

// Nothing listening: the call fails at once with ErrUnavailable rather than
// waiting for a connection.
func TestAgentUnreachable(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(harness.FreePort(t)))
	c := newClient(t, addr, client.Options{Timeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.Allow(ctx, client.Request{Descriptors: map[string]string{"user": "x"}})
	if !errors.Is(err, client.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Allow to a closed port = %v, want ErrUnavailable without waiting for the deadline", err)
	}
	s := c.AllowStream(ctx)
	defer s.Close()
	_, err = s.Allow(ctx, client.Request{Descriptors: map[string]string{"user": "x"}})
	if !errors.Is(err, client.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stream.Allow to a closed port = %v, want ErrUnavailable without waiting for the deadline", err)
	}
}

func TestNewRejectsNegativeTimeouts(t *testing.T) {
	if _, err := client.New("127.0.0.1:1", client.Options{Timeout: -time.Second}); err == nil {
		t.Error("New with a negative Timeout succeeded")
	}
	if _, err := client.New("127.0.0.1:1", client.Options{BatchTimeout: -time.Second}); err == nil {
		t.Error("New with a negative BatchTimeout succeeded")
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

// A Stream against the agent: decisions in order on one stream, an
// invalid request failing alone.
func TestStreamDecisions(t *testing.T) {
	srv, _ := startAgent(t, clientRules)
	c := newClient(t, srv.GRPCAddr(), client.Options{Timeout: 10 * time.Second})
	s := c.AllowStream(context.Background())
	defer s.Close()
	ctx := context.Background()
	carol := client.Request{Descriptors: map[string]string{"user": "carol"}}
	for i := 0; i < 2; i++ {
		if d, err := s.Allow(ctx, carol); err != nil || !d.Allowed || d.Rule != "per-user" || d.Remaining != int64(1-i) {
			t.Fatalf("Stream.Allow %d = %+v, %v; want admitted with %d left", i, d, err, 1-i)
		}
	}
	if _, err := s.Allow(ctx, client.Request{Descriptors: map[string]string{"user": "carol"}, Cost: -1}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("Stream.Allow cost -1 = %v, want ErrInvalid", err)
	}
	if d, err := s.Allow(ctx, carol); err != nil || d.Allowed || d.Reason != client.ReasonOverLimit || d.Status() != 429 {
		t.Fatalf("3rd Stream.Allow = %+v, %v; want over_limit on the same stream", d, err)
	}
}

// clienttest.Bucket answers what the agent answers for the same rule: the
// fake that importers test with is held to the real thing.
func TestBucketMatchesAgent(t *testing.T) {
	srv, _ := startAgent(t, clientRules)
	c := newClient(t, srv.GRPCAddr(), client.Options{Timeout: 10 * time.Second})
	fake := clienttest.New(clienttest.Bucket("per-user", 2, 1.0/3600, nil))
	ctx := context.Background()
	reqs := []client.Request{
		{Descriptors: map[string]string{"user": "dave"}},
		{Descriptors: map[string]string{"user": "dave"}},
		{Descriptors: map[string]string{"user": "dave"}},
		{Descriptors: map[string]string{"user": "erin"}, Cost: 2},
		{Descriptors: map[string]string{"user": "erin"}},
		{Rule: "per-user", Subject: "frank"},
		{Rule: "per-user", Subject: "frank", Cost: 3},
		{Rule: "per-user", Subject: "frank", Cost: -1},
	}
	near := func(a, b time.Duration) bool { return (a - b).Abs() <= time.Second }
	for i, r := range reqs {
		want, werr := c.Allow(ctx, r)
		got, gerr := fake.Allow(ctx, r)
		if errors.Is(werr, client.ErrInvalid) != errors.Is(gerr, client.ErrInvalid) || (werr == nil) != (gerr == nil) {
			t.Fatalf("request %d %+v: agent %v, fake %v", i, r, werr, gerr)
		}
		if werr != nil {
			continue
		}
		if got.Allowed != want.Allowed || got.Reason != want.Reason || got.Rule != want.Rule || got.Limit != want.Limit ||
			got.Remaining != want.Remaining || math.Abs(got.Rate-want.Rate) > 1e-12 || got.Status() != want.Status() ||
			!near(got.RetryAfter, want.RetryAfter) || !near(got.Reset, want.Reset) {
			t.Fatalf("request %d %+v:\n agent %+v\n fake  %+v", i, r, want, got)
		}
	}

	// And the middleware writes the same fields from either.
	describe := func(r *http.Request) (client.Request, bool) {
		return client.Request{Descriptors: map[string]string{"user": r.Header.Get("X-User-Id")}}, true
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	real := client.Middleware(c, describe, client.MiddlewareOptions{})(ok)
	faked := client.Middleware(fake, describe, client.MiddlewareOptions{})(ok)
	for i := 0; i < 3; i++ {
		var recs [2]*httptest.ResponseRecorder
		for j, h := range []http.Handler{real, faked} {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.Header.Set("X-User-Id", "gina")
			recs[j] = httptest.NewRecorder()
			h.ServeHTTP(recs[j], req)
		}
		for _, name := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
			if a, f := recs[0].Header().Get(name), recs[1].Header().Get(name); a != f || recs[0].Code != recs[1].Code {
				t.Fatalf("request %d: agent %d %s: %q, fake %d %s: %q", i, recs[0].Code, name, a, recs[1].Code, name, f)
			}
		}
	}
}
