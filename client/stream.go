package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Stream decides requests over the agent's AllowStream call: one HTTP/2
// stream carries every decision, in both directions, with no per-call
// headers. The agent answers a stream's requests one at a time, in the
// order they were sent; for more concurrency open several Streams, or use
// AllowBatch for requests decided together.
//
// A Stream is safe for concurrent use and is an Allower (Middleware takes
// it). Each decision has the deadline a unary Allow would have (the
// earlier of the caller's and Options.Timeout). A caller that gives up
// does not hold up the others: its answer, when it comes, is dropped, and
// a request whose caller gave up before it was sent is not sent. When the
// stream ends (the agent restarted, the connection broke) the decisions
// waiting on it fail with ErrUnavailable and the next Allow opens a new
// stream.
type Stream struct {
	rl      rationv1.RateLimiterClient
	timeout time.Duration
	ctx     context.Context // the Stream's life
	cancel  context.CancelFunc
	wg      sync.WaitGroup // the pipes' goroutines

	mu  sync.Mutex
	cur *pipe
}

// AllowStream returns a Stream of decisions on c's connection. Like New it
// does not connect: the first Allow opens the stream. ctx bounds the
// Stream's life, not each decision (give a long-lived one, such as the
// server's); Close ends it.
func (c *Client) AllowStream(ctx context.Context) *Stream {
	ctx, cancel := context.WithCancel(ctx)
	return &Stream{rl: c.rl, timeout: c.timeout, ctx: ctx, cancel: cancel}
}

var _ Allower = (*Stream)(nil)

// Allow sends req on the stream and waits for its decision. Errors are
// those of Client.Allow: they wrap ErrInvalid (the agent rejected this
// request; the stream goes on) or ErrUnavailable (no decision: the stream
// ended, or the deadline passed), or are the caller's context.Canceled.
func (s *Stream) Allow(ctx context.Context, req Request) (Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	p, err := s.pipe()
	if err != nil {
		return Decision{}, err
	}
	c := &streamCall{ctx: ctx, req: toProto(req), out: make(chan *rationv1.AllowResponse, 1)}
	select {
	case p.calls <- c:
	case <-p.done:
		return Decision{}, s.ended(p)
	case <-ctx.Done():
		return Decision{}, deadlineError(ctx)
	}
	select {
	case resp := <-c.out:
		return streamDecision(resp)
	case <-p.done:
		select {
		case resp := <-c.out: // answered just before the end
			return streamDecision(resp)
		default:
			return Decision{}, s.ended(p)
		}
	case <-ctx.Done():
		return Decision{}, deadlineError(ctx)
	}
}

// Close ends the stream; decisions still waiting on it fail with
// ErrUnavailable, and so does every later Allow. It returns once the
// Stream's goroutines have.
func (s *Stream) Close() error {
	s.cancel()
	s.mu.Lock() // no pipe starts after this (pipe checks s.ctx under s.mu)
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// errStreamClosed: Allow after Close, or after AllowStream's context ended.
var errStreamClosed = fmt.Errorf("%w: stream closed", ErrUnavailable)

// pipe returns the open stream, opening one when there is none or the last
// one ended.
func (s *Stream) pipe() (*pipe, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return nil, errStreamClosed
	}
	if s.cur == nil || s.cur.ended() {
		ctx, cancel := context.WithCancel(s.ctx)
		p := &pipe{cancel: cancel, calls: make(chan *streamCall, 64), done: make(chan struct{})}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			p.run(ctx, s.rl, &s.wg)
		}()
		s.cur = p
	}
	return s.cur, nil
}

// ended is the error of a decision that was waiting on p when it ended.
func (s *Stream) ended(p *pipe) error {
	if s.ctx.Err() != nil {
		return errStreamClosed
	}
	return fmt.Errorf("%w: stream ended: %w", ErrUnavailable, p.err)
}

// deadlineError is the error of a decision whose context ended first, as
// callError words it for unary calls.
func deadlineError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("ration: %w", context.Canceled)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, context.DeadlineExceeded)
}

func streamDecision(resp *rationv1.AllowResponse) (Decision, error) {
	if resp.GetReason() == rationv1.Reason_REASON_INVALID {
		return Decision{}, fmt.Errorf("%w: %s", ErrInvalid, resp.GetError())
	}
	return fromProto(resp), nil
}

// streamCall is one decision asked on a stream.
type streamCall struct {
	ctx context.Context // the caller's: done means nobody waits any more
	req *rationv1.AllowRequest
	out chan *rationv1.AllowResponse // buffered: the receiver never blocks
}

// pipe is one AllowStream call: a sender goroutine writes the calls in the
// order they come, a receiver matches each answer to the oldest call sent.
type pipe struct {
	cancel context.CancelFunc
	calls  chan *streamCall
	done   chan struct{} // closed, with err set, when the stream has ended

	mu   sync.Mutex
	sent []*streamCall // sent and not yet answered, oldest first
	err  error
}

func (p *pipe) ended() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// end records why the stream ended (the first reason wins) and wakes every
// caller waiting on it.
func (p *pipe) end(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return
	}
	p.err = err
	p.sent = nil
	close(p.done)
	p.cancel()
}

func (p *pipe) run(ctx context.Context, rl rationv1.RateLimiterClient, wg *sync.WaitGroup) {
	st, err := rl.AllowStream(ctx)
	if err != nil {
		p.end(err)
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.receive(st)
	}()
	for {
		var c *streamCall
		select {
		case <-p.done:
			return
		case c = <-p.calls:
		}
		if c.ctx.Err() != nil {
			continue // its caller gave up before it was sent: not sent, not charged
		}
		p.mu.Lock()
		if p.err != nil {
			p.mu.Unlock()
			return
		}
		p.sent = append(p.sent, c)
		p.mu.Unlock()
		if err := st.Send(c.req); err != nil {
			if !errors.Is(err, io.EOF) {
				p.end(err)
			}
			// io.EOF: the stream is over, and Recv has its status.
			return
		}
	}
}

func (p *pipe) receive(st rationv1.RateLimiter_AllowStreamClient) {
	for {
		resp, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the agent closed the stream")
			}
			p.end(err)
			return
		}
		p.mu.Lock()
		if len(p.sent) == 0 {
			p.mu.Unlock()
			p.end(errors.New("the agent answered a request that was not sent"))
			return
		}
		c := p.sent[0]
		p.sent[0] = nil
		p.sent = p.sent[1:]
		p.mu.Unlock()
		c.out <- resp
	}
}
