package coordinator

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/grpcsafe"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// maxStreamCalls bounds the calls of one RenewStream served at once. Past
// it the stream is not read until one ends, and HTTP/2's flow control holds
// the holder back. A holder has one call in flight, a client shared by
// many holders (a test, a bench) one per holder.
const maxStreamCalls = 256

// maxStreamsPerConn bounds the RenewStreams open at once on one
// connection. A client keeps one (a new one may open while the node has
// not yet seen the last one's end); the bound keeps a connection's calls
// in flight at maxStreamsPerConn*maxStreamCalls, near what
// MaxConcurrentStreams allowed it in unary calls.
const maxStreamsPerConn = 4

// streamCount counts the RenewStreams open on each connection (by the
// client's address, which names one connection).
type streamCount struct {
	mu     sync.Mutex
	byPeer map[string]int
}

// add counts one more stream for ctx's connection, or refuses it past the
// bound; done uncounts it.
func (c *streamCount) add(ctx context.Context) (done func(), ok bool) {
	key := ""
	if p, found := peer.FromContext(ctx); found && p.Addr != nil {
		key = p.Addr.String()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byPeer[key] >= maxStreamsPerConn {
		return nil, false
	}
	if c.byPeer == nil {
		c.byPeer = map[string]int{}
	}
	c.byPeer[key]++
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.byPeer[key]--; c.byPeer[key] <= 0 {
			delete(c.byPeer, key)
		}
	}, true
}

// RenewStream serves Renew calls sent as messages on one stream. Each call
// is served on a goroutine of its own, as a unary call would be (it waits
// for its Raft entry, and entries batch the calls waiting together), and
// answered with its id whenever it is done. An error is the call's (in its
// reply), never the stream's: the stream ends when the holder closes it,
// the connection goes, or the node stops (UNAVAILABLE naming the leader,
// as a call refused for it would be). Calls in flight when the holder
// half-closes, or when the node starts to stop, are answered first.
func (s *leasesServer) RenewStream(stream rationv1.Leases_RenewStreamServer) error {
	n := s.n
	ctx := stream.Context()
	done, ok := s.streams.add(ctx)
	if !ok {
		return status.Errorf(codes.ResourceExhausted, "renew stream: %d already open on this connection", maxStreamsPerConn)
	}
	defer done()
	n.m.renewStreams.Inc()
	defer n.m.renewStreams.Dec()
	var (
		sendMu sync.Mutex // Send is not safe for concurrent use
		wg     sync.WaitGroup
	)
	slots := make(chan struct{}, maxStreamCalls)
	// No Send after the handler returns (gRPC forbids it): every call's
	// goroutine ends first. They end soon once ctx is done (their waits
	// for commits are bounded by it).
	defer wg.Wait()
	// Recv blocks; it runs on a goroutine of its own so that the node's
	// stop (drain) can end the stream, which a graceful stop waits for.
	calls := make(chan *rationv1.RenewCall)
	ended := make(chan error, 1)
	go func() {
		for {
			call, err := stream.Recv()
			if err != nil {
				ended <- err
				return
			}
			select {
			case calls <- call:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		var call *rationv1.RenewCall
		select {
		case call = <-calls:
		case err := <-ended:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-n.drain:
			wg.Wait()
			return n.rpcError(ctx, ErrStopped)
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			reply := s.serveCall(ctx, call)
			sendMu.Lock()
			// A failed Send means the stream is over, which Recv reports.
			_ = stream.Send(reply)
			sendMu.Unlock()
			<-slots
		}()
	}
}

// serveCall answers one call of a RenewStream as Renew would, its status
// in the reply. A panic answers INTERNAL, as the interceptors make it for
// a unary call, and leaves the stream and its other calls alone.
func (s *leasesServer) serveCall(ctx context.Context, call *rationv1.RenewCall) (reply *rationv1.RenewReply) {
	n := s.n
	defer func() {
		if r := recover(); r != nil {
			st := status.Convert(grpcsafe.Recovered(n.logger, n.m.grpcPanics.Inc, rationv1.Leases_RenewStream_FullMethodName, r))
			reply = &rationv1.RenewReply{Id: call.GetId(), Code: int32(st.Code()), Message: st.Message()}
		}
	}()
	reply = &rationv1.RenewReply{Id: call.GetId()}
	if call.GetRequest() == nil {
		reply.Code, reply.Message = int32(codes.InvalidArgument), "renew stream: a call without a request"
		return reply
	}
	if ms := call.GetTimeoutMs(); ms > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(ms)*time.Millisecond)
		defer cancel()
	}
	resp, err := s.renew(ctx, call.GetRequest())
	if err != nil {
		st, leader := n.rpcStatus(ctx, err)
		reply.Code, reply.Message, reply.Leader = int32(st.Code()), st.Message(), leader
		return reply
	}
	reply.Response = resp
	return reply
}
