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
	// opening is taken by the call that opens the stream; ready is closed
	// once it is open or has failed to, and the other calls wait for it
	// (or for their own contexts).
	opening atomic.Bool
	ready   chan struct{}

	mu      sync.Mutex
	cancel  context.CancelFunc
	pending map[uint64]chan streamResult
	err     error         // why it ended (a gRPC status error), once it has
	leader  string        // with UNAVAILABLE: the leader the node named, if any
	done    chan struct{} // closed when it has ended
}

// streamResult is a call's reply, or why it has none: err, and with
// UNAVAILABLE the leader's address if the node named one (a node that
// stops ends its streams naming the leader, as a trailer would).
type streamResult struct {
	reply  *rationv1.RenewReply
	err    error
	leader string
}

func newRenewStream(cc *grpc.ClientConn) *renewStream {
	return &renewStream{
		cc:      cc,
		send:    make(chan *rationv1.RenewCall, 64),
		ready:   make(chan struct{}),
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
	r := rs.call(ctx, req)
	if errors.Is(r.err, errNoRenewStream) {
		c.noStream(cc)
		return rationv1.NewLeasesClient(cc).Renew(ctx, req, opts...)
	}
	if r.err != nil {
		if r.leader != "" && status.Code(r.err) == codes.Unavailable {
			setLeaderTrailer(opts, r.leader)
		}
		return nil, r.err
	}
	reply := r.reply
	if code := codes.Code(reply.GetCode()); code != codes.OK {
		if code == codes.Unavailable {
			setLeaderTrailer(opts, reply.GetLeader())
		}
		return nil, status.Error(code, reply.GetMessage())
	}
	if reply.GetResponse() == nil {
		return nil, status.Error(codes.Internal, "renew stream: a reply without a response")
	}
	return reply.GetResponse(), nil
}

// setLeaderTrailer gives the trailer opts asks for (Client.do's) the
// leader's address, as a unary call's UNAVAILABLE would carry it.
func setLeaderTrailer(opts []grpc.CallOption, leader string) {
	for _, o := range opts {
		if t, ok := o.(grpc.TrailerCallOption); ok {
			*t.TrailerAddr = metadata.Pairs(LeaderTrailer, leader)
		}
	}
}

// renewStream returns cc's stream, a new one if it has none or its last
// has ended; nil when cc's node has no RenewStream (for streamRetry).
func (c *Client) renewStream(cc *grpc.ClientConn) *renewStream {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil // the unary call fails as after Close
	}
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
		rs.end(status.Error(codes.Unavailable, "renew stream: connection closed"), "")
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

// open opens the stream unless another call has (or is opening it), and
// returns why this call cannot use it: its own context ending while it
// waits (nil when the stream is open or has ended: rs.err says which).
// The stream outlives the call that opens it, so it gets a context of its
// own; the opening call's context bounds only the wait for it to open,
// and a stream that did not open in that time fails the calls waiting
// for it as UNAVAILABLE (the next call opens another), whatever ended
// the opening call's wait.
func (rs *renewStream) open(ctx context.Context) error {
	if !rs.opening.CompareAndSwap(false, true) {
		select {
		case <-rs.ready:
			return nil
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	defer close(rs.ready)
	sctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	stream, err := rationv1.NewLeasesClient(rs.cc).RenewStream(sctx)
	if !stop() {
		// ctx ended while the stream was opening (a connection still
		// connecting, a node not answering): tell this call why, and the
		// others that the stream is not there.
		rs.end(status.Error(codes.Unavailable, "renew stream: not open within the opening call's time"), "")
		cancel()
		return status.FromContextError(ctx.Err()).Err()
	}
	if err != nil {
		cancel()
		rs.end(err, "")
		return nil
	}
	rs.mu.Lock()
	failed := rs.err != nil // ended while opening (its connection closed)
	rs.cancel = cancel
	rs.mu.Unlock()
	if failed {
		cancel()
		return nil
	}
	go rs.sendLoop(stream)
	go rs.recvLoop(stream)
	return nil
}

// call sends req on the stream and waits for its reply, until ctx is done.
// req is read until the message is sent, which may be after call returns
// (a call that gave up while its message waited to go).
func (rs *renewStream) call(ctx context.Context, req *rationv1.RenewRequest) streamResult {
	if err := rs.open(ctx); err != nil {
		return streamResult{err: err}
	}
	id := rs.next.Add(1)
	ch := make(chan streamResult, 1)
	rs.mu.Lock()
	if rs.err != nil {
		r := streamResult{err: rs.err, leader: rs.leader}
		rs.mu.Unlock()
		return r
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
		return r
	case <-ctx.Done():
		rs.forget(id)
		return streamResult{err: status.FromContextError(ctx.Err()).Err()}
	}
	select {
	case r := <-ch:
		return r
	case <-ctx.Done():
		rs.forget(id)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && rs.received.Load() == seen {
			// Not one reply in the whole of this call's time: the node is
			// paused or cut off, and the stream with it. The next call
			// opens another, which fails fast if the connection is down.
			// (A call cancelled by its caller says nothing about the node.)
			rs.end(status.Error(codes.Unavailable, "renew stream: no reply within the call's timeout"), "")
		}
		return streamResult{err: status.FromContextError(ctx.Err()).Err()}
	}
}

func (rs *renewStream) forget(id uint64) {
	rs.mu.Lock()
	delete(rs.pending, id)
	rs.mu.Unlock()
}

// end ends the stream for err (the first reason given wins), with the
// leader a node that stopped named: every call waiting gets them, and so
// does every later call.
func (rs *renewStream) end(err error, leader string) {
	if status.Code(err) == codes.Unimplemented {
		err = errNoRenewStream
	} else if _, ok := status.FromError(err); !ok || err == nil {
		// io.EOF, or another error of no status: the node went away.
		err = status.Errorf(codes.Unavailable, "renew stream: %v", err)
	}
	rs.mu.Lock()
	if rs.err != nil {
		rs.mu.Unlock()
		return
	}
	rs.err, rs.leader = err, leader
	pending := rs.pending
	rs.pending = nil
	cancel := rs.cancel
	close(rs.done)
	rs.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	for _, ch := range pending {
		ch <- streamResult{err: err, leader: leader}
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
			leader := ""
			if v := stream.Trailer().Get(LeaderTrailer); len(v) > 0 {
				leader = v[0]
			}
			rs.end(err, leader)
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
