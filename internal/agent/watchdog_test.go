package agent_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// wedgingLeases is a lease holder with a bug of the worst kind: spending
// the quota of tenant "stuck" never returns (a lock taken twice, say), and
// its renewal loop can be made to stop stepping. Every other subject is
// admitted.
type wedgingLeases struct {
	start    time.Time
	release  chan struct{}
	loopDead atomic.Bool
	mu       sync.Mutex // held by the stuck spend, wanted by the loop's release
}

// Run is the renewal loop: at its end it releases the leases, which needs
// the lock the stuck spend holds, as a real holder's release would.
func (l *wedgingLeases) Run(ctx context.Context) {
	<-ctx.Done()
	l.mu.Lock()
	l.mu.Unlock() //nolint:staticcheck // an empty critical section: waiting for the lock is the point
}

func (l *wedgingLeases) Now() int64 { return time.Since(l.start).Microseconds() }

func (l *wedgingLeases) Spend(_ context.Context, _ *rules.Rule, subject string, _ float64, now int64) (bucket.Result, holder.Source, bool) {
	if subject == "tenant=stuck" {
		l.mu.Lock()
		<-l.release
		l.mu.Unlock()
	}
	return bucket.Result{Allowed: true, Remaining: 1, Now: now}, holder.Source{}, true
}

func (l *wedgingLeases) Refund(holder.Source, float64) {}
func (l *wedgingLeases) DownFor() time.Duration        { return 0 }

// Stepped is what holder.Leases reports of its renewal loop.
func (l *wedgingLeases) Stepped() time.Time {
	if l.loopDead.Load() {
		return l.start
	}
	return time.Now()
}

func startWedgeable(t *testing.T, l *wedgingLeases) *agent.Server {
	t.Helper()
	r := harness.StartRedis(t)
	return startAgentLeases(t, r.Addr, panicRules, l, func(cfg *agent.Config) { cfg.StallTimeout = time.Second }).srv
}

func healthz(t *testing.T, srv *agent.Server) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + srv.HTTPAddr() + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A decision that never completes turns /healthz to 503, naming the cause,
// within seconds (-stall-timeout 1s here), and ration_agent_wedged to 1;
// /healthz is green again once it completes. A renewal loop that stops
// stepping does the same. And a wedged agent still shuts down: Shutdown
// returns when its context ends, whatever the handler is doing.
func TestWedgedDecisionTurnsHealthzRed(t *testing.T) {
	l := &wedgingLeases{start: time.Now(), release: make(chan struct{})}
	srv := startWedgeable(t, l)
	if code, body := healthz(t, srv); code != http.StatusOK {
		t.Fatalf("/healthz before any wedge = %d %q, want 200", code, body)
	}
	released := false
	release := func() {
		if !released {
			released = true
			close(l.release)
		}
	}
	t.Cleanup(release)

	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = srv.Service.Decide(context.Background(), agent.Request{Descriptors: map[string]string{"tenant": "stuck"}})
	}()
	waitFor(t, "/healthz to fail with a decision stuck", func() bool {
		code, body := healthz(t, srv)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "decisions in flight")
	})
	if got := metricValue(t, srv.Registry, "ration_agent_wedged", nil); got != 1 {
		t.Fatalf("ration_agent_wedged = %v while wedged, want 1", got)
	}
	// Other decisions still work meanwhile: the watchdog reports, it does
	// not stop anything.
	if resp, err := srv.Service.Decide(context.Background(), agent.Request{Descriptors: map[string]string{"user": "u"}}); err != nil || !resp.Allowed {
		t.Fatalf("another decision while one is stuck = %v, %v", resp, err)
	}
	release()
	<-done
	waitFor(t, "/healthz to recover", func() bool { code, _ := healthz(t, srv); return code == http.StatusOK })
	if got := metricValue(t, srv.Registry, "ration_agent_wedged", nil); got != 0 {
		t.Fatalf("ration_agent_wedged = %v after recovery, want 0", got)
	}

	l.loopDead.Store(true)
	waitFor(t, "/healthz to fail with the lease loop stopped", func() bool {
		code, body := healthz(t, srv)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "lease renewal loop")
	})
	l.loopDead.Store(false)
	waitFor(t, "/healthz to recover", func() bool { code, _ := healthz(t, srv); return code == http.StatusOK })
}

// Shutdown of an agent with a handler that never returns (over gRPC, so
// GracefulStop would wait for it for ever) and a lease loop that cannot
// release its leases (it waits for the lock the stuck handler holds)
// returns once its context ends: SIGTERM stops a wedged agent.
func TestShutdownOfWedgedAgentReturns(t *testing.T) {
	l := &wedgingLeases{start: time.Now(), release: make(chan struct{})}
	srv := startWedgeable(t, l)
	t.Cleanup(func() { close(l.release) })
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rl := rationv1.NewRateLimiterClient(conn)
	go func() {
		_, _ = rl.Allow(context.Background(), &rationv1.AllowRequest{Descriptors: map[string]string{"tenant": "stuck"}})
	}()
	waitFor(t, "the stuck call to be in flight", func() bool { return srv.Wedged() != "" })
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	returned := make(chan error, 1)
	go func() { returned <- srv.Shutdown(ctx) }()
	select {
	case err := <-returned:
		if err == nil {
			t.Fatalf("Shutdown with a call stuck = nil, want the context's error (it could not finish gracefully)")
		}
	case <-time.After(10 * time.Second):
		// Its context ends after 1s: nine more are far beyond any close.
		t.Fatal("Shutdown of a wedged agent did not return after its context ended")
	}
}

// Envoy's ShouldRateLimit is watched as every decision is: its pipeline
// was a fork of DecideBatch's that never told the watchdog, so a wedged
// RLS call left /healthz green.
func TestWedgedShouldRateLimitTurnsHealthzRed(t *testing.T) {
	l := &wedgingLeases{start: time.Now(), release: make(chan struct{})}
	r := harness.StartRedis(t)
	a := startAgentLeases(t, r.Addr, panicRules, l, func(cfg *agent.Config) { cfg.StallTimeout = time.Second })
	var once sync.Once
	release := func() { once.Do(func() { close(l.release) }) }
	t.Cleanup(release)
	c := envoyClient(t, a)
	done := make(chan struct{})
	go func() {
		defer close(done)
		req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("tenant", "stuck")}}
		_, _ = c.ShouldRateLimit(context.Background(), req)
	}()
	waitFor(t, "/healthz to fail with a ShouldRateLimit stuck", func() bool {
		code, body := healthz(t, a.srv)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "decisions in flight")
	})
	release()
	<-done
	waitFor(t, "/healthz to recover", func() bool { code, _ := healthz(t, a.srv); return code == http.StatusOK })
}
