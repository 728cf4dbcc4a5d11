package grpcsafe_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/grpcsafe"
	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// panicking is a health service whose calls panic, as a bug in a handler
// would.
type panicking struct {
	healthpb.UnimplementedHealthServer
}

func (panicking) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	panic("a bug in a handler")
}

func (panicking) Watch(*healthpb.HealthCheckRequest, healthpb.Health_WatchServer) error {
	panic("a bug in a stream handler")
}

// A handler that panics, unary or streaming, answers that call with
// codes.Internal over a real connection; the server goes on serving.
func TestPanicsAnswerInternal(t *testing.T) {
	var n int
	srv := grpc.NewServer(grpcsafe.ServerOptions(slog.New(slog.DiscardHandler), func() { n++ })...)
	healthpb.RegisterHealthServer(srv, panicking{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := healthpb.NewHealthClient(conn)
	for i := range 2 {
		if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Internal {
			t.Fatalf("unary call %d: %v, want Internal", i, err)
		}
	}
	st, err := c.Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.Internal {
		t.Fatalf("stream: %v, want Internal", err)
	}
	if n != 3 {
		t.Errorf("panicked counted %d times, want 3", n)
	}
}

// long is a string of n bytes, distinct per i so that map keys differ.
func long(i, n int) string {
	s := fmt.Sprintf("%03d", i)
	return s + strings.Repeat("x", n-len(s))
}

// The largest request each server accepts whole fits in MaxRecvMsgSize:
// the bound refuses nothing the handlers would have served. Every string
// is at its limit and every number at its widest encoding, so these are
// upper bounds.
func TestLargestRequestsFit(t *testing.T) {
	big := 1e300 // a double is 8 bytes whatever its value; set, it is sent
	descriptors := func(n int) map[string]string {
		d := make(map[string]string, n)
		for i := range n {
			d[long(i, rules.MaxKeyLen)] = long(i, rules.MaxKeyLen)
		}
		return d
	}
	allow := &rationv1.AllowRequest{
		Descriptors: descriptors(rules.MaxDescriptors), Rule: long(0, rules.MaxNameLen),
		Subject: long(0, agent.MaxSubjectLen), Cost: big, RequestId: long(0, bucket.MaxRequestIDLen),
	}
	renew := &rationv1.RenewRequest{Holder: long(0, lease.MaxNameLen), Seq: math.MaxUint64, Region: long(0, lease.MaxNameLen)}
	for i := range lease.MaxItems {
		renew.Items = append(renew.Items, &rationv1.RenewItem{
			Quota:   &rationv1.QuotaRef{Rule: long(i, lease.MaxNameLen), Subject: long(i, lease.MaxNameLen)},
			LeaseId: math.MaxUint64, Unused: big, Demand: big, ConfirmedCap: big, ConfirmedRate: big, ConfirmedSafeShare: &big,
		})
	}
	release := &rationv1.ReleaseRequest{Holder: renew.Holder, Seq: renew.Seq, Items: renew.Items}
	renewCall := &rationv1.RenewCall{Id: math.MaxUint64, Request: renew, TimeoutMs: math.MaxUint32}
	envoy := &rlsv3.RateLimitRequest{Domain: long(0, rules.MaxKeyLen), HitsAddend: math.MaxUint32}
	for range agent.MaxEnvoyDescriptors {
		d := &ratelimitv3.RateLimitDescriptor{HitsAddend: wrapperspb.UInt64(math.MaxUint64)}
		// One key of the rules' limit is the domain's.
		for i := range rules.MaxDescriptors - 1 {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: long(i, rules.MaxKeyLen), Value: long(i, rules.MaxKeyLen)})
		}
		envoy.Descriptors = append(envoy.Descriptors, d)
	}
	for _, m := range []struct {
		name string
		msg  proto.Message
	}{{"Allow", allow}, {"Renew", renew}, {"RenewStream's call", renewCall}, {"Release", release}, {"ShouldRateLimit", envoy}} {
		if n := proto.Size(m.msg); n > grpcsafe.MaxRecvMsgSize {
			t.Errorf("the largest %s is %d bytes, over MaxRecvMsgSize %d", m.name, n, grpcsafe.MaxRecvMsgSize)
		} else {
			t.Logf("the largest %s is %d bytes", m.name, n)
		}
	}
	// AllowBatch: MaxBatch requests of 830 bytes each, as the bound's
	// comment says.
	one := &rationv1.AllowRequest{Descriptors: map[string]string{"user": strings.Repeat("u", 300), "path": strings.Repeat("p", 300)},
		Rule: long(0, rules.MaxNameLen), Subject: strings.Repeat("s", 100), Cost: big}
	if n := proto.Size(one); n < 800 || n > 830 {
		t.Fatalf("batch item is %d bytes, want 800 to 830", n)
	}
	batch := &rationv1.AllowBatchRequest{Requests: make([]*rationv1.AllowRequest, agent.MaxBatch)}
	for i := range batch.Requests {
		batch.Requests[i] = one
	}
	if n := proto.Size(batch); n > grpcsafe.MaxRecvMsgSize {
		t.Errorf("an AllowBatch of %d requests of %d bytes is %d bytes, over MaxRecvMsgSize %d",
			agent.MaxBatch, proto.Size(one), n, grpcsafe.MaxRecvMsgSize)
	}
}

// echo answers Check with SERVING and holds every Watch open until its
// caller goes.
type echo struct {
	healthpb.UnimplementedHealthServer
}

func (echo) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (echo) Watch(_ *healthpb.HealthCheckRequest, st healthpb.Health_WatchServer) error {
	<-st.Context().Done()
	return nil
}

func serve(t *testing.T, svc healthpb.HealthServer) healthpb.HealthClient {
	t.Helper()
	srv := grpc.NewServer(grpcsafe.ServerOptions(slog.New(slog.DiscardHandler), nil)...)
	healthpb.RegisterHealthServer(srv, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// A message over MaxRecvMsgSize is refused with RESOURCE_EXHAUSTED, one
// at the bound is served, and the connection goes on serving.
func TestMessageSizeBound(t *testing.T) {
	c := serve(t, echo{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Field 1 (service): a tag byte and a 4-byte length before the text.
	fits := &healthpb.HealthCheckRequest{Service: strings.Repeat("s", grpcsafe.MaxRecvMsgSize-5)}
	if n := proto.Size(fits); n != grpcsafe.MaxRecvMsgSize {
		t.Fatalf("request is %d bytes, want %d", n, grpcsafe.MaxRecvMsgSize)
	}
	if _, err := c.Check(ctx, fits); err != nil {
		t.Fatalf("a request of MaxRecvMsgSize bytes: %v", err)
	}
	over := &healthpb.HealthCheckRequest{Service: fits.Service + "s"}
	if _, err := c.Check(ctx, over); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a request one byte over MaxRecvMsgSize: %v, want ResourceExhausted", err)
	}
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("after the refusal: %v", err)
	}
}

// One connection holds at most MaxConcurrentStreams calls in flight: the
// next waits for one of them to end.
func TestConcurrentStreamsBound(t *testing.T) {
	c := serve(t, echo{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cancels := make([]context.CancelFunc, grpcsafe.MaxConcurrentStreams)
	for i := range cancels {
		sctx, scancel := context.WithCancel(ctx)
		cancels[i] = scancel
		if _, err := c.Watch(sctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	defer func() {
		for _, f := range cancels {
			f()
		}
	}()
	// The client has seen the server's SETTINGS by now (the first stream
	// was answered): stream MaxConcurrentStreams+1 waits for a slot.
	wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c.Check(wctx, &healthpb.HealthCheckRequest{})
	wcancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("call %d on one connection: %v, want it to wait (DeadlineExceeded)", grpcsafe.MaxConcurrentStreams+1, err)
	}
	cancels[0]()
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("once a stream ended: %v", err)
	}
}
