package coordclient

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Renew calls go as messages on one Leases.RenewStream per connection: a
// message on an open stream costs the holder and the coordinator a
// fraction of a unary call (no headers to write and parse, no HTTP/2
// stream, no per-call goroutine and buffers on the node), which is most of
// what a renewal costs them besides its share of a Raft entry. The calls
// keep every other property of the unary Renew: the same attempt timeout,
// retries, redirects by the leader's address, and answers; a coordinator of
// an earlier version (UNIMPLEMENTED) gets unary calls instead.

// streamRetry is how long a connection whose node answered UNIMPLEMENTED
// to RenewStream gets unary Renew calls before the stream is tried again
// (the node may have been upgraded meanwhile).
const streamRetry = time.Minute

// errNoRenewStream: the node does not serve RenewStream (an earlier version).
var errNoRenewStream = errors.New("coordinator has no RenewStream")

// renewStream is one RenewStream and the calls waiting for its replies.
// It is opened by the first call that needs it and never reopened: once it
// has ended, the next call makes another.
type renewStream struct {
	cc   *grpc.ClientConn
	next atomic.Uint64 // the last call id given out
	// received counts replies; a call that times out with none received
	// since it was sent found the stream (or its node) stuck.
	received atomic.Uint64
	send     chan *rationv1.RenewCall // to the sending goroutine

	openMu sync.Mutex // held by the call opening the stream
	opened bool       // under openMu
	cancel context.CancelFunc

	mu      sync.Mutex
	pending map[uint64]chan streamResult
	err     error         // why it ended (a gRPC status error), once it has
	done    chan struct{} // closed when it has ended
}

type streamResult struct {
	reply *rationv1.RenewReply
	err   error
}

func newRenewStream(cc *grpc.ClientConn) *renewStream {
	return &renewStream{
		cc:      cc,
		send:    make(chan *rationv1.RenewCall, 64),
		pending: make(map[uint64]chan streamResult),
		done:    make(chan struct{}),
	}
}

// renewOn is one Renew attempt on cc: on its stream, or unary where the
// node has none. A reply's error comes back as the unary call's status
// would, its leader address in the trailer opts asks for.
func (c *Client) renewOn(ctx context.Context, cc *grpc.ClientConn, req *rationv1.RenewRequest, opts ...grpc.CallOption) (*rationv1.RenewResponse, error) {
	rs := c.renewStream(cc)
	if rs == nil {
		return rationv1.NewLeasesClient(cc).Renew(ctx, req, opts...)
	}
	reply, err := rs.call(ctx, req)
	if errors.Is(err, errNoRenewStream) {
		c.noStream(cc)
		return rationv1.NewLeasesClient(cc).Renew(ctx, req, opts...)
	}
	if err != nil {
		return nil, err
	}
	if code := codes.Code(reply.GetCode()); code != codes.OK {
		if code == codes.Unavailable {
			for _, o := range opts {
				if t, ok := o.(grpc.TrailerCallOption); ok {
					*t.TrailerAddr = metadata.Pairs(LeaderTrailer, reply.GetLeader())
				}
			}
		}
		return nil, status.Error(code, reply.GetMessage())
	}
	if reply.GetResponse() == nil {
		return nil, status.Error(codes.Internal, "renew stream: a reply without a response")
	}
	return reply.GetResponse(), nil
}

// renewStream returns cc's stream, a new one if it has none or its last
// has ended; nil when cc's node has no RenewStream (for streamRetry).
func (c *Client) renewStream(cc *grpc.ClientConn) *renewStream {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.unaryOnly[cc]; ok {
		if time.Since(t) < streamRetry {
			return nil
		}
		delete(c.unaryOnly, cc)
	}
	rs := c.streams[cc]
	if rs == nil || rs.ended() {
		rs = newRenewStream(cc)
		c.streams[cc] = rs
	}
	return rs
}

func (c *Client) noStream(cc *grpc.ClientConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.unaryOnly[cc]; !ok {
		c.opts.Logger.Warn("coordinator has no RenewStream (older version): renewing with unary calls", "target", cc.Target())
	}
	c.unaryOnly[cc] = time.Now()
}

// closeStream ends cc's stream, if any (its connection is being closed).
// Under c.mu.
func (c *Client) closeStream(cc *grpc.ClientConn) {
	if rs := c.streams[cc]; rs != nil {
		rs.end(status.Error(codes.Unavailable, "renew stream: connection closed"))
		delete(c.streams, cc)
	}
	delete(c.unaryOnly, cc)
}

func (rs *renewStream) ended() bool {
	select {
	case <-rs.done:
		return true
	default:
		return false
	}
}

// open opens the stream unless it is open (or failed to open) already. The
// stream outlives the call that opens it, so it gets a context of its own;
// the call's bounds only the wait for it to open.
func (rs *renewStream) open(ctx context.Context) {
	rs.openMu.Lock()
	defer rs.openMu.Unlock()
	if rs.opened {
		return
	}
	rs.opened = true
	sctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	stream, err := rationv1.NewLeasesClient(rs.cc).RenewStream(sctx)
	if !stop() && err == nil {
		err = status.FromContextError(ctx.Err()).Err()
	}
	rs.mu.Lock()
	rs.cancel = cancel
	failed := rs.err != nil // ended while opening (its connection closed)
	rs.mu.Unlock()
	switch {
	case failed:
		cancel()
		return
	case err != nil:
		rs.end(err)
		return
	}
	go rs.sendLoop(stream)
	go rs.recvLoop(stream)
}

// call sends req on the stream and waits for its reply, until ctx is done.
func (rs *renewStream) call(ctx context.Context, req *rationv1.RenewRequest) (*rationv1.RenewReply, error) {
	rs.open(ctx)
	id := rs.next.Add(1)
	ch := make(chan streamResult, 1)
	rs.mu.Lock()
	if rs.err != nil {
		err := rs.err
		rs.mu.Unlock()
		return nil, err
	}
	rs.pending[id] = ch
	rs.mu.Unlock()
	seen := rs.received.Load()
	msg := &rationv1.RenewCall{Id: id, Request: req}
	if d, ok := ctx.Deadline(); ok {
		msg.TimeoutMs = uint32(min(max(time.Until(d).Milliseconds()+1, 1), 1<<32-1))
	}
	select {
	case rs.send <- msg:
	case r := <-ch: // the stream ended
		return r.reply, r.err
	case <-ctx.Done():
		rs.forget(id)
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	select {
	case r := <-ch:
		return r.reply, r.err
	case <-ctx.Done():
		rs.forget(id)
		if rs.received.Load() == seen {
			// Not one reply since this call went: the node is paused or
			// cut off, and the stream with it. The next call opens another,
			// which fails fast if the connection is down.
			rs.end(status.Error(codes.Unavailable, "renew stream: no reply within the call's timeout"))
		}
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

func (rs *renewStream) forget(id uint64) {
	rs.mu.Lock()
	delete(rs.pending, id)
	rs.mu.Unlock()
}

// end ends the stream for err (the first reason given wins): every call
// waiting gets it, and so does every later call.
func (rs *renewStream) end(err error) {
	if status.Code(err) == codes.Unimplemented {
		err = errNoRenewStream
	} else if _, ok := status.FromError(err); !ok {
		// io.EOF, or another error of no status: the node went away.
		err = status.Error(codes.Unavailable, "renew stream: "+err.Error())
	}
	rs.mu.Lock()
	if rs.err != nil {
		rs.mu.Unlock()
		return
	}
	rs.err = err
	pending := rs.pending
	rs.pending = nil
	cancel := rs.cancel
	close(rs.done)
	rs.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	for _, ch := range pending {
		ch <- streamResult{err: err}
	}
}

func (rs *renewStream) sendLoop(stream rationv1.Leases_RenewStreamClient) {
	for {
		select {
		case msg := <-rs.send:
			if err := stream.Send(msg); err != nil {
				// The stream is over; RecvMsg says why (io.EOF here).
				return
			}
		case <-rs.done:
			return
		}
	}
}

func (rs *renewStream) recvLoop(stream rationv1.Leases_RenewStreamClient) {
	for {
		reply, err := stream.Recv()
		if err != nil {
			rs.end(err)
			return
		}
		rs.received.Add(1)
		rs.mu.Lock()
		ch := rs.pending[reply.GetId()]
		delete(rs.pending, reply.GetId())
		rs.mu.Unlock()
		if ch != nil { // else its call gave up
			ch <- streamResult{reply: reply}
		}
	}
}
