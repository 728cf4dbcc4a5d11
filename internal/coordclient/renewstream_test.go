package coordclient_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/coordclient"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// These tests script the node's side of the Leases protocol over real
// gRPC on loopback, to give the client what a real group gives only by
// chance: a node of an earlier version, one that stops answering, replies
// out of order. The client against real coordinators is covered by
// internal/coordinator's tests (every Renew there goes on a stream).

// serveLeases serves srv on a loopback port until the test ends and
// returns its address and how many RenewStreams were opened on it.
func serveLeases(t *testing.T, srv rationv1.LeasesServer) (string, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	streams := new(atomic.Int64)
	s := grpc.NewServer(grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if info.FullMethod == rationv1.Leases_RenewStream_FullMethodName {
			streams.Add(1)
		}
		return h(srv, ss)
	}))
	rationv1.RegisterLeasesServer(s, srv)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return l.Addr().String(), streams
}

// answer is the response a scripted node gives req: one grant whose lease
// id is the request's seq, so a caller can tell its answer from another's.
func answer(req *rationv1.RenewRequest) *rationv1.RenewResponse {
	return &rationv1.RenewResponse{Grants: []*rationv1.Grant{{LeaseId: req.GetSeq(), Balance: 1}}}
}

func renewReq(seq uint64) *rationv1.RenewRequest {
	return &rationv1.RenewRequest{Holder: "h", Seq: seq, Items: []*rationv1.RenewItem{{Quota: &rationv1.QuotaRef{Rule: "r", Subject: "s"}}}}
}

// unaryOnlyNode is a coordinator of a version before RenewStream.
type unaryOnlyNode struct {
	rationv1.UnimplementedLeasesServer
	calls atomic.Int64
}

func (n *unaryOnlyNode) Renew(_ context.Context, req *rationv1.RenewRequest) (*rationv1.RenewResponse, error) {
	n.calls.Add(1)
	return answer(req), nil
}

// TestRenewFallsBackToUnary: a node that answers RenewStream UNIMPLEMENTED
// gets the same call as a unary Renew, and later calls go unary without
// trying the stream again.
func TestRenewFallsBackToUnary(t *testing.T) {
	node := &unaryOnlyNode{}
	addr, streams := serveLeases(t, node)
	cl := coordclient.New([]string{addr}, coordclient.Options{})
	defer cl.Close()
	for seq := uint64(1); seq <= 3; seq++ {
		resp, err := cl.Renew(context.Background(), renewReq(seq))
		if err != nil {
			t.Fatalf("Renew %d on a node without RenewStream: %v", seq, err)
		}
		if got := resp.GetGrants()[0].GetLeaseId(); got != seq {
			t.Errorf("Renew %d answered with lease %d, want %d", seq, got, seq)
		}
	}
	if got := node.calls.Load(); got != 3 {
		t.Errorf("unary Renew calls = %d, want 3", got)
	}
	if got := streams.Load(); got != 1 {
		t.Errorf("RenewStreams opened = %d, want 1 (then unary until the retry interval)", got)
	}
}

// silentNode reads a RenewStream's calls and never answers them.
type silentNode struct {
	rationv1.UnimplementedLeasesServer
}

func (silentNode) RenewStream(st rationv1.Leases_RenewStreamServer) error {
	for {
		if _, err := st.Recv(); err != nil {
			return nil
		}
	}
}

// TestRenewStreamStuck: a stream on which no reply comes within an
// attempt's timeout is given up; the next attempt opens another stream,
// and the call ends after MaxAttempts with DEADLINE_EXCEEDED, as a unary
// call to a silent node does.
func TestRenewStreamStuck(t *testing.T) {
	addr, streams := serveLeases(t, silentNode{})
	cl := coordclient.New([]string{addr}, coordclient.Options{
		CallTimeout: 50 * time.Millisecond, MaxAttempts: 3, BackoffMin: time.Millisecond, BackoffMax: 2 * time.Millisecond,
	})
	defer cl.Close()
	_, err := cl.Renew(context.Background(), renewReq(1))
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("Renew to a node that never answers = %v, want DEADLINE_EXCEEDED", err)
	}
	if got := streams.Load(); got != 3 {
		t.Errorf("RenewStreams opened = %d, want 3 (one per attempt: each stuck stream is given up)", got)
	}
}

// scriptedNode answers each stream call with what reply returns (nil: no
// answer).
type scriptedNode struct {
	rationv1.UnimplementedLeasesServer
	reply func(*rationv1.RenewCall) *rationv1.RenewReply
}

func (n scriptedNode) RenewStream(st rationv1.Leases_RenewStreamServer) error {
	for {
		call, err := st.Recv()
		if err != nil {
			return nil
		}
		if r := n.reply(call); r != nil {
			if err := st.Send(r); err != nil {
				return err
			}
		}
	}
}

// TestRenewStreamRedirect: a call's UNAVAILABLE reply naming the leader
// sends the client there, as the unary call's trailer does; other codes
// come back as the call's status; a reply with no response is an error.
func TestRenewStreamRedirect(t *testing.T) {
	leader, _ := serveLeases(t, scriptedNode{reply: func(c *rationv1.RenewCall) *rationv1.RenewReply {
		switch c.GetRequest().GetSeq() {
		case 2:
			return &rationv1.RenewReply{Id: c.GetId(), Code: int32(codes.FailedPrecondition), Message: "stale seq"}
		case 3:
			return &rationv1.RenewReply{Id: c.GetId()}
		}
		return &rationv1.RenewReply{Id: c.GetId(), Response: answer(c.GetRequest())}
	}})
	follower, _ := serveLeases(t, scriptedNode{reply: func(c *rationv1.RenewCall) *rationv1.RenewReply {
		return &rationv1.RenewReply{Id: c.GetId(), Code: int32(codes.Unavailable), Message: "not the leader", Leader: leader}
	}})
	cl := coordclient.New([]string{follower}, coordclient.Options{})
	defer cl.Close()
	resp, err := cl.Renew(context.Background(), renewReq(1))
	if err != nil || resp.GetGrants()[0].GetLeaseId() != 1 {
		t.Fatalf("Renew through a follower = %v, %v; want the leader's answer", resp, err)
	}
	if got := cl.Leader(); got != leader {
		t.Errorf("client's leader = %q, want %q (named in the follower's reply)", got, leader)
	}
	if _, err := cl.Renew(context.Background(), renewReq(2)); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "stale seq") {
		t.Errorf("Renew answered FAILED_PRECONDITION = %v, want that status and message", err)
	}
	if _, err := cl.Renew(context.Background(), renewReq(3)); status.Code(err) != codes.Internal {
		t.Errorf("Renew answered with no response = %v, want INTERNAL", err)
	}
}

// reversingNode holds a stream's calls until it has n, then answers them
// last first, and then every later call at once.
type reversingNode struct {
	rationv1.UnimplementedLeasesServer
	n int
}

func (n reversingNode) RenewStream(st rationv1.Leases_RenewStreamServer) error {
	var held []*rationv1.RenewCall
	for {
		call, err := st.Recv()
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil
		}
		if err != nil {
			return err
		}
		held = append(held, call)
		if len(held) < n.n {
			continue
		}
		for i := len(held) - 1; i >= 0; i-- {
			if err := st.Send(&rationv1.RenewReply{Id: held[i].GetId(), Response: answer(held[i].GetRequest())}); err != nil {
				return err
			}
		}
		held, n.n = nil, 1
	}
}

// TestRenewStreamOutOfOrder: concurrent calls share one stream and each
// gets its own answer, whatever order the replies come in.
func TestRenewStreamOutOfOrder(t *testing.T) {
	const calls = 16
	addr, streams := serveLeases(t, reversingNode{n: calls})
	cl := coordclient.New([]string{addr}, coordclient.Options{CallTimeout: 10 * time.Second})
	defer cl.Close()
	var wg sync.WaitGroup
	for seq := uint64(1); seq <= calls; seq++ {
		wg.Go(func() {
			resp, err := cl.Renew(context.Background(), renewReq(seq))
			if err != nil {
				t.Errorf("Renew %d: %v", seq, err)
				return
			}
			if got := resp.GetGrants()[0].GetLeaseId(); got != seq {
				t.Errorf("Renew %d got the answer to %d", seq, got)
			}
		})
	}
	wg.Wait()
	if _, err := cl.Renew(context.Background(), renewReq(calls+1)); err != nil {
		t.Errorf("Renew after the batch: %v", err)
	}
	if got := streams.Load(); got != 1 {
		t.Errorf("RenewStreams opened = %d, want 1 shared by every call", got)
	}
}

// mute accepts TCP connections and never speaks HTTP/2: a gRPC connection
// to it stays connecting, as one to a host that drops packets does.
func mute(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	return l.Addr().String()
}

// TestRenewStreamOpeningTimesOut: attempts whose stream cannot open in
// their time (the connection never gets ready) end as a unary call's
// would, DEADLINE_EXCEEDED or UNAVAILABLE, both retried, for the call that
// was opening the stream and for those waiting for it; never CANCELED,
// which Client.do does not retry.
func TestRenewStreamOpeningTimesOut(t *testing.T) {
	cl := coordclient.New([]string{mute(t)}, coordclient.Options{
		CallTimeout: 50 * time.Millisecond, MaxAttempts: 3, BackoffMin: time.Millisecond, BackoffMax: 2 * time.Millisecond,
	})
	defer cl.Close()
	var wg sync.WaitGroup
	for seq := uint64(1); seq <= 4; seq++ {
		wg.Go(func() {
			_, err := cl.Renew(context.Background(), renewReq(seq))
			if c := status.Code(err); c != codes.DeadlineExceeded && c != codes.Unavailable {
				t.Errorf("Renew %d to a node that never gets ready = %v, want DEADLINE_EXCEEDED or UNAVAILABLE", seq, err)
			}
		})
	}
	wg.Wait()
}

// TestRenewStreamCallerCancels: a caller that gives up (its context
// cancelled, not timed out) leaves the stream to the others: it says
// nothing about the node.
func TestRenewStreamCallerCancels(t *testing.T) {
	got := make(chan struct{}) // the node has the call that will be cancelled
	addr, streams := serveLeases(t, scriptedNode{reply: func(c *rationv1.RenewCall) *rationv1.RenewReply {
		if c.GetRequest().GetSeq() == 1 {
			close(got)
			return nil // never answered
		}
		return &rationv1.RenewReply{Id: c.GetId(), Response: answer(c.GetRequest())}
	}})
	cl := coordclient.New([]string{addr}, coordclient.Options{CallTimeout: time.Minute})
	defer cl.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cl.Renew(ctx, renewReq(1))
		done <- err
	}()
	<-got // sent, and no reply on the stream since
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Errorf("Renew cancelled by its caller = %v, want CANCELED (as a unary call's)", err)
	}
	if resp, err := cl.Renew(context.Background(), renewReq(2)); err != nil || resp.GetGrants()[0].GetLeaseId() != 2 {
		t.Errorf("Renew after a cancelled one = %v, %v; want its answer", resp, err)
	}
	if got := streams.Load(); got != 1 {
		t.Errorf("RenewStreams opened = %d, want 1: a cancelled call does not end the stream", got)
	}
}

// stoppingNode ends each RenewStream as a stopping coordinator does:
// UNAVAILABLE, naming the leader in the trailer, without answering.
type stoppingNode struct {
	rationv1.UnimplementedLeasesServer
	leader string
}

func (n stoppingNode) RenewStream(st rationv1.Leases_RenewStreamServer) error {
	if _, err := st.Recv(); err != nil {
		return nil
	}
	st.SetTrailer(metadata.Pairs(coordclient.LeaderTrailer, n.leader))
	return status.Error(codes.Unavailable, "coordinator stopped")
}

// TestRenewStreamEndsNamingLeader: calls cut off by a stream that ends
// naming the leader go there next, as a unary call's trailer sends them.
func TestRenewStreamEndsNamingLeader(t *testing.T) {
	leader, _ := serveLeases(t, scriptedNode{reply: func(c *rationv1.RenewCall) *rationv1.RenewReply {
		return &rationv1.RenewReply{Id: c.GetId(), Response: answer(c.GetRequest())}
	}})
	stopping, _ := serveLeases(t, stoppingNode{leader: leader})
	// Only the stopping node is configured: without its trailer the client
	// has nowhere else to go.
	cl := coordclient.New([]string{stopping}, coordclient.Options{MaxAttempts: 3})
	defer cl.Close()
	if resp, err := cl.Renew(context.Background(), renewReq(1)); err != nil || resp.GetGrants()[0].GetLeaseId() != 1 {
		t.Fatalf("Renew through a stopping node = %v, %v; want the leader's answer", resp, err)
	}
	if got := cl.Leader(); got != leader {
		t.Errorf("client's leader = %q, want %q (named as the stream ended)", got, leader)
	}
}
