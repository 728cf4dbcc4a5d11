package agent_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Connections that send their header one byte a second are closed by the
// agent's HTTP listeners (the API and -metrics) after their header timeout
// (server.go's ReadHeaderTimeout, 5s; their ReadTimeout, 10s, would close
// them too, but later), while the agent goes on answering.
func TestSlowLorisAgentHTTP(t *testing.T) {
	a := startAgent(t, oneRule, func(cfg *agent.Config) { cfg.MetricsAddr = "127.0.0.1:0" })
	harness.CheckSlowLoris(t, 5*time.Second, 8, a.srv.HTTPAddr(), a.srv.MetricsAddr())
	if resp := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"user": "after"}}); !resp.Allowed {
		t.Fatalf("Allow after the slow-loris connections = %v", resp)
	}
}

// panickingLeases is a lease holder with a bug: spending the quota of
// tenant "boom" panics, in the goroutine of the call being decided, as a
// bug anywhere on a decision's path would. Every other subject is admitted.
type panickingLeases struct{ start time.Time }

func (l panickingLeases) Now() int64 { return time.Since(l.start).Microseconds() }

func (panickingLeases) Spend(_ context.Context, _ *rules.Rule, subject string, _ float64, now int64) (bucket.Result, holder.Source, bool) {
	if subject == "tenant=boom" {
		panic("a bug on the decision path")
	}
	return bucket.Result{Allowed: true, Remaining: 1, Now: now}, holder.Source{}, true
}

func (panickingLeases) Refund(holder.Source, float64) {}
func (panickingLeases) DownFor() time.Duration        { return 0 }

const panicRules = `
rules:
  - name: leased
    match: {tenant: "*"}
    burst: 1000
    rate: 1000
    mode: leased
    lease: {period: 1s}
  - name: per-user
    match: {user: "*"}
    burst: 1000
    rate: 0
`

// A handler that panics, on every gRPC API of a real agent (Allow,
// AllowBatch, AllowStream, Envoy's ShouldRateLimit), answers that call
// INTERNAL; the agent goes on serving every other call, on the same
// connection, and counts each panic in ration_grpc_panics_total. The panic
// comes from the lease holder the agent was started with (Start's leases
// argument), deep in a real decision; the server, its options and its
// handlers are the production ones. Without the recovery the panic ends
// the process, here the test binary.
func TestHandlerPanicAnswersInternal(t *testing.T) {
	r := harness.StartRedis(t)
	srv := startAgentLeases(t, r.Addr, panicRules, panickingLeases{start: time.Now()}).srv
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rl, envoy, hc := rationv1.NewRateLimiterClient(conn), rlsv3.NewRateLimitServiceClient(conn), healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	serving := func(when string) {
		t.Helper()
		if resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("%s: Health/Check = %v, %v", when, resp, err)
		}
		for _, d := range []map[string]string{{"tenant": "acme"}, {"user": "u"}} {
			if resp, err := rl.Allow(ctx, &rationv1.AllowRequest{Descriptors: d}); err != nil || !resp.Allowed {
				t.Fatalf("%s: Allow(%v) = %v, %v", when, d, resp, err)
			}
		}
		resp, err := http.Get("http://" + srv.HTTPAddr() + "/readyz")
		if err != nil {
			t.Fatalf("%s: GET /readyz: %v", when, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: GET /readyz: %s", when, resp.Status)
		}
	}
	serving("before the panics")

	boom := map[string]string{"tenant": "boom"}
	wantInternal := func(call string, err error) {
		t.Helper()
		if status.Code(err) != codes.Internal {
			t.Fatalf("%s: %v, want Internal", call, err)
		}
	}
	_, err = rl.Allow(ctx, &rationv1.AllowRequest{Descriptors: boom})
	wantInternal("Allow", err)
	_, err = rl.AllowBatch(ctx, &rationv1.AllowBatchRequest{Requests: []*rationv1.AllowRequest{
		{Descriptors: map[string]string{"user": "v"}}, {Descriptors: boom},
	}})
	wantInternal("AllowBatch", err)
	st, err := rl.AllowStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&rationv1.AllowRequest{Descriptors: map[string]string{"tenant": "acme"}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := st.Recv(); err != nil || !resp.Allowed {
		t.Fatalf("AllowStream, first message = %v, %v", resp, err)
	}
	if err := st.Send(&rationv1.AllowRequest{Descriptors: boom}); err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	wantInternal("AllowStream", err)
	_, err = envoy.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "boom"}}},
	}})
	wantInternal("ShouldRateLimit", err)
	// The HTTP API too: answered 500, not a cut connection.
	hresp, err := http.Get("http://" + srv.HTTPAddr() + "/v1/check?tenant=boom")
	if err != nil {
		t.Fatalf("GET /v1/check with the panicking holder: %v, want a 500 answer", err)
	}
	hresp.Body.Close()
	if hresp.StatusCode != http.StatusInternalServerError {
		t.Errorf("GET /v1/check with the panicking holder = %s, want 500", hresp.Status)
	}

	serving("after the panics")
	resp, err := http.Get("http://" + srv.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ration_grpc_panics_total .*$`).Find(body)
	if string(m) != "ration_grpc_panics_total 4" {
		t.Errorf("/metrics has %q, want ration_grpc_panics_total 4", m)
	}
}
