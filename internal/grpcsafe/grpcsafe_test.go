package grpcsafe_test

import (
	"context"
	"log/slog"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/grpcsafe"
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
