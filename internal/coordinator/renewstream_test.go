package coordinator_test

import (
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// TestRenewStream: a RenewStream call is a unary Renew's twin on a real
// group. Its answer is the one the state machine recorded (a unary retry
// with the same seq replays it, field for field); a bad call is refused
// alone, in its reply, and the stream goes on; a follower's reply names
// the leader; calls in flight when the holder half-closes are answered
// before the stream ends.
func TestRenewStream(t *testing.T) {
	c := harness.StartCoordinators(t, 3, testRules, noTicks)
	leader, ln := c.Leader(t)
	dial := func(addr string) rationv1.LeasesClient {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return rationv1.NewLeasesClient(cc)
	}
	ctx := timeout(t, 30*time.Second)
	lc := dial(ln.GRPCAddr())
	st, err := lc.RenewStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a, b := newHolder("a"), newHolder("b")
	reqA, reqB := a.request(testQuotas, 1), b.request(testQuotas[:1], 1)
	calls := []*rationv1.RenewCall{
		{Id: 7, Request: reqA, TimeoutMs: 10_000},
		{Id: 8}, // no request
		{Id: 9, Request: &rationv1.RenewRequest{}}, // no holder
		{Id: 10, Request: reqB},                    // no timeout: the stream's
	}
	for _, call := range calls {
		if err := st.Send(call); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	replies := map[uint64]*rationv1.RenewReply{}
	for {
		r, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("stream ended with %v, want every call answered, then EOF", err)
		}
		if replies[r.Id] != nil {
			t.Errorf("call %d answered twice", r.Id)
		}
		replies[r.Id] = r
	}
	if len(replies) != len(calls) {
		t.Fatalf("%d replies for %d calls: %v", len(replies), len(calls), replies)
	}
	for _, id := range []uint64{8, 9} {
		if r := replies[id]; codes.Code(r.Code) != codes.InvalidArgument || r.Message == "" || r.Response != nil {
			t.Errorf("call %d (malformed) answered %v, want INVALID_ARGUMENT with a message and no response", id, r)
		}
	}
	for _, tc := range []struct {
		id  uint64
		h   *holder
		req *rationv1.RenewRequest
	}{{7, a, reqA}, {10, b, reqB}} {
		if r := replies[tc.id]; r.Code != 0 || r.Response == nil {
			t.Fatalf("call %d answered %v, want a response", tc.id, r)
		} else if err := tc.h.adopt(tc.req, r.Response); err != nil {
			t.Fatalf("call %d: %v", tc.id, err)
		}
	}
	// b's call was one grant, a's next is one renewal of its three leases:
	// each is one command, whose answer a retry replays whole.
	reqA2 := a.request(testQuotas, 2)
	st2, err := lc.RenewStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st2.Send(&rationv1.RenewCall{Id: 1, Request: reqA2}); err != nil {
		t.Fatal(err)
	}
	r2, err := st2.Recv()
	if err != nil || r2.Code != 0 {
		t.Fatalf("a's renewal on a stream: %v, %v", r2, err)
	}
	for _, tc := range []struct {
		what string
		req  *rationv1.RenewRequest
		resp *rationv1.RenewResponse
	}{{"b's grant", reqB, replies[10].Response}, {"a's renewal", reqA2, r2.Response}} {
		again, err := lc.Renew(ctx, tc.req)
		if err != nil {
			t.Fatalf("unary retry of %s: %v", tc.what, err)
		}
		if !proto.Equal(again, tc.resp) {
			t.Errorf("%s: the stream answered %v, a unary retry %v: want the same recorded answer", tc.what, tc.resp, again)
		}
	}

	// One connection keeps at most MaxStreamsPerConn streams open (a
	// client keeps one): the next is refused, the others go on.
	cc := dial(ln.GRPCAddr())
	var open []rationv1.Leases_RenewStreamClient
	for i := range coordinator.MaxStreamsPerConn + 1 {
		s, err := cc.RenewStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&rationv1.RenewCall{Id: 1, Request: newHolder(fmt.Sprint("c", i)).request(testQuotas[:1], 1)}); err != nil {
			t.Fatal(err)
		}
		open = append(open, s)
		// Each answered before the next opens: the node has counted it.
		if i < coordinator.MaxStreamsPerConn {
			if r, err := s.Recv(); err != nil || r.Code != 0 {
				t.Fatalf("stream %d of one connection: %v, %v", i+1, r, err)
			}
		}
	}
	if _, err := open[coordinator.MaxStreamsPerConn].Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("stream %d of one connection ended with %v, want RESOURCE_EXHAUSTED", coordinator.MaxStreamsPerConn+1, err)
	}
	// Open on the leader: these, and st2 (the refused one is not).
	const gauge = "ration_coordinator_renew_streams"
	if got, want := harness.Gauge(t, c.Registry(leader), gauge), float64(coordinator.MaxStreamsPerConn+1); got != want {
		t.Errorf("%s = %v with %v streams open, want %v", gauge, got, want, want)
	}
	for _, s := range open[:coordinator.MaxStreamsPerConn] {
		s.CloseSend()
		if _, err := s.Recv(); !errors.Is(err, io.EOF) {
			t.Errorf("a stream within the bound, closed by its holder, ended with %v, want EOF", err)
		}
	}
	if got := harness.Gauge(t, c.Registry(leader), gauge); got != 1 {
		t.Errorf("%s = %v once only st2 is open, want 1", gauge, got)
	}
	if s, err := cc.RenewStream(ctx); err != nil {
		t.Fatal(err)
	} else if err := s.Send(&rationv1.RenewCall{Id: 1, Request: newHolder("after").request(testQuotas[:1], 1)}); err != nil {
		t.Fatal(err)
	} else if r, err := s.Recv(); err != nil || r.Code != 0 {
		t.Errorf("a stream after the others closed: %v, %v; want an answer", r, err)
	}

	// A follower answers each call UNAVAILABLE naming the leader, and keeps
	// the stream open for the next.
	f := (leader + 1) % 3
	fst, err := dial(c.Node(f).GRPCAddr()).RenewStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 2; id++ {
		if err := fst.Send(&rationv1.RenewCall{Id: id, Request: newHolder("f").request(testQuotas, 1)}); err != nil {
			t.Fatal(err)
		}
		r, err := fst.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r.Id != id || codes.Code(r.Code) != codes.Unavailable || r.Leader != ln.GRPCAddr() {
			t.Errorf("follower answered call %d with %v, want UNAVAILABLE naming %s", id, r, ln.GRPCAddr())
		}
	}

	// A node that stops ends its streams itself (UNAVAILABLE naming the
	// leader, as a call refused for it is), so its graceful stop need not
	// wait for them until its timeout and cut them: a stream cut by that
	// hard stop would end UNAVAILABLE too, but with no trailer.
	c.Shutdown(f)
	if _, err := fst.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("the stream of a stopped node ended with %v, want UNAVAILABLE", err)
	}
	if got := fst.Trailer().Get(coordinator.LeaderTrailer); len(got) != 1 || got[0] != ln.GRPCAddr() {
		t.Errorf("the stream of a stopped node ended with trailer %s = %q, want [%q]: ended by the node, naming the leader", coordinator.LeaderTrailer, got, ln.GRPCAddr())
	}
}
