package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Coalescing: Client.Allow calls made while others are on the wire wait to
// go out together in one AllowBatch call, which the agent decides in one
// round trip to its store and answers in one message.
//
// A call is sent at once, on its own as a unary Allow, when fewer than
// CoalesceInFlight calls of the Client are on the wire (by default: none):
// a lone caller pays nothing. Otherwise it waits in a queue, oldest first, until a call on the
// wire returns (the queue then goes out as one batch), the queue holds
// CoalesceMaxItems calls, or the oldest has waited CoalesceDelay; whichever
// comes first. The delay is a Go timer: on an otherwise idle process it
// may fire up to about a millisecond late, but a batch returning sends the
// queue too, so no call waits longer than the slower of the two.

const (
	// DefaultCoalesceDelay is Options.CoalesceDelay when zero. It bounds
	// the wait behind a call that is slow to return; a call that returns
	// sends the queue sooner. Shorter delays split the queue into smaller
	// batches: from 64 goroutines, 50µs sent about 12 calls per batch at
	// 7.6µs of the agent's CPU per decision, 200µs about 28 at 4.4-5.6µs
	// (docs/performance.md).
	DefaultCoalesceDelay = 200 * time.Microsecond
	// DefaultCoalesceMaxItems is Options.CoalesceMaxItems when zero.
	DefaultCoalesceMaxItems = 128
	// DefaultCoalesceInFlight is Options.CoalesceInFlight when zero.
	DefaultCoalesceInFlight = 1
	// MaxBatch is the most requests the agent takes in one AllowBatch.
	MaxBatch = 10000
)

// errClientClosed fails the calls still waiting when the Client closes,
// and every later call.
var errClientClosed = fmt.Errorf("%w: client closed", ErrUnavailable)

// coalescer gathers a Client's concurrent Allow calls into AllowBatch calls.
type coalescer struct {
	rl       rationv1.RateLimiterClient
	delay    time.Duration
	maxItems int
	inFlight int // the calls on the wire below which a call is sent at once

	mu      sync.Mutex
	queue   []*pending // waiting to be sent, oldest first; may hold abandoned ones
	waiting int        // the queue's calls not abandoned
	onWire  int        // calls (unary or batch) sent and not returned
	closed  bool
	timer   *time.Timer // fires when the oldest waiting call is due
	armed   bool
	wg      sync.WaitGroup // batch goroutines
}

// pending is one Allow call through the coalescer.
type pending struct {
	req      *rationv1.AllowRequest
	deadline time.Time
	queued   time.Time // when it joined the queue
	state    pendingState
	// Set before done is closed: the agent's answer, or why there is none.
	resp *rationv1.AllowResponse
	err  error // the batch's error, mapped by the caller with its own context
	done chan struct{}
}

type pendingState uint8

const (
	stateQueued    pendingState = iota
	stateAbandoned              // its caller gave up before it was sent: never sent
	stateSent
)

func newCoalescer(rl rationv1.RateLimiterClient, opts Options) *coalescer {
	c := &coalescer{rl: rl, delay: opts.CoalesceDelay, maxItems: opts.CoalesceMaxItems, inFlight: opts.CoalesceInFlight}
	c.timer = time.AfterFunc(time.Hour, c.due)
	c.timer.Stop()
	return c
}

// coalescable reports whether req may share a message with others. A
// string that is not UTF-8 makes the whole message unmarshalable, and
// outgoing metadata belongs to one caller's call: such calls go out alone.
func coalescable(ctx context.Context, req *Request) bool {
	if _, ok := metadata.FromOutgoingContext(ctx); ok {
		return false
	}
	if !utf8.ValidString(req.Rule) || !utf8.ValidString(req.Subject) || !utf8.ValidString(req.RequestID) {
		return false
	}
	for k, v := range req.Descriptors {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return false
		}
	}
	return true
}

// allow decides req, alone or in a batch; ctx carries the call's deadline.
func (c *coalescer) allow(ctx context.Context, req *rationv1.AllowRequest) (*rationv1.AllowResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, deadlineError(ctx)
	}
	deadline, _ := ctx.Deadline()
	now := time.Now()
	p := &pending{req: req, deadline: deadline, queued: now, done: make(chan struct{})}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errClientClosed
	}
	c.queue = append(c.queue, p)
	c.waiting++
	batch := c.takeLocked(now)
	c.mu.Unlock()
	if len(batch) == 1 && batch[0] == p {
		// Sent alone: as a unary call of this caller's own, which its
		// context cancels on the wire as well.
		resp, err := c.rl.Allow(ctx, req)
		c.returned()
		c.wg.Done()
		if err != nil {
			return nil, callError(ctx, err)
		}
		return resp, nil
	}
	if batch != nil {
		c.start(batch)
		c.flush()
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		c.mu.Lock()
		if p.state == stateQueued {
			p.state = stateAbandoned
			c.waiting--
		}
		c.mu.Unlock()
		select {
		case <-p.done: // answered meanwhile
		default:
			return nil, deadlineError(ctx)
		}
	}
	if p.err != nil {
		return nil, c.batchError(ctx, p.err)
	}
	return p.resp, nil
}

// takeLocked returns the calls to send now, marked sent and counted on
// the wire, or nil; it arms the timer when calls wait for it.
func (c *coalescer) takeLocked(now time.Time) []*pending {
	c.trimLocked()
	if c.waiting == 0 || c.closed {
		return nil
	}
	if c.onWire >= c.inFlight && c.waiting < c.maxItems {
		if due := c.queue[0].queued.Add(c.delay); now.Before(due) {
			if !c.armed {
				c.armed = true
				c.timer.Reset(due.Sub(now))
			}
			return nil
		}
	}
	n := min(c.waiting, c.maxItems)
	batch := make([]*pending, 0, n)
	i := 0
	for ; i < len(c.queue) && len(batch) < n; i++ {
		p := c.queue[i]
		c.queue[i] = nil
		if p.state == stateAbandoned {
			continue
		}
		p.state = stateSent
		batch = append(batch, p)
	}
	c.queue = c.queue[i:]
	c.waiting -= len(batch)
	c.onWire++
	c.wg.Add(1) // under c.mu, so Close waits for it; Done once it returned
	return batch
}

// trimLocked drops abandoned calls from the queue's head, so that its
// first call is the oldest one still waiting.
func (c *coalescer) trimLocked() {
	i := 0
	for i < len(c.queue) && c.queue[i].state == stateAbandoned {
		c.queue[i] = nil
		i++
	}
	c.queue = c.queue[i:]
	if len(c.queue) == 0 {
		c.queue = c.queue[:0:0] // let a burst's array go
	}
}

// due is the timer's: the oldest waiting call has waited the delay.
func (c *coalescer) due() {
	c.mu.Lock()
	c.armed = false
	c.mu.Unlock()
	c.flush()
}

// returned records that a call left the wire, and sends what waited on it.
func (c *coalescer) returned() {
	c.mu.Lock()
	c.onWire--
	c.mu.Unlock()
	c.flush()
}

// flush sends every batch that is due.
func (c *coalescer) flush() {
	for {
		c.mu.Lock()
		batch := c.takeLocked(time.Now())
		c.mu.Unlock()
		if batch == nil {
			return
		}
		c.start(batch)
	}
}

// start sends batch from a goroutine of its own, so that no caller waits
// on another's call: a caller whose context ends returns at once.
func (c *coalescer) start(batch []*pending) {
	if len(batch) == 0 {
		return
	}
	go func() {
		defer c.wg.Done()
		c.send(batch)
		c.returned()
	}()
}

// send makes one AllowBatch call of batch and gives each caller its
// answer, or the call's error.
func (c *coalescer) send(batch []*pending) {
	in := &rationv1.AllowBatchRequest{Requests: make([]*rationv1.AllowRequest, len(batch))}
	deadline := batch[0].deadline
	for i, p := range batch {
		in.Requests[i] = p.req
		if p.deadline.After(deadline) {
			deadline = p.deadline
		}
	}
	// The batch lives as long as its longest-lived call: each caller's
	// own deadline ends its own wait.
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	resp, err := c.rl.AllowBatch(ctx, in)
	if err == nil && len(resp.GetResponses()) != len(batch) {
		err = fmt.Errorf("%d answers for %d requests", len(resp.GetResponses()), len(batch))
	}
	for i, p := range batch {
		if err != nil {
			p.err = err
		} else {
			p.resp = resp.GetResponses()[i]
		}
		close(p.done)
	}
}

// batchError is the error of a call whose batch failed, for its caller.
func (c *coalescer) batchError(ctx context.Context, err error) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	switch {
	case closed:
		return errClientClosed
	case ctx.Err() != nil:
		return deadlineError(ctx)
	case status.Code(err) == codes.DeadlineExceeded:
		// The batch lives until its latest caller's deadline: this
		// caller's has passed too, a moment before its own timer fires.
		return fmt.Errorf("%w: %w", ErrUnavailable, context.DeadlineExceeded)
	default:
		return fmt.Errorf("%w: coalesced call: %w", ErrUnavailable, err)
	}
}

// close fails the calls still waiting and returns once the batches on the
// wire have returned (the connection closing ends them).
func (c *coalescer) close(closeConn func() error) error {
	c.mu.Lock()
	c.closed = true
	c.timer.Stop()
	c.armed = false
	for _, p := range c.queue {
		if p.state == stateQueued {
			p.state = stateAbandoned
			p.err = errors.New("client closed")
			close(p.done)
		}
	}
	c.queue, c.waiting = nil, 0
	c.mu.Unlock()
	err := closeConn()
	c.wg.Wait()
	return err
}
