package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// DefaultTimeout bounds a decision when Options.Timeout is zero. It is
// above the agent's default -decision-timeout (50ms), so that when the
// agent's store is slow the rule's failure policy decides, not this
// deadline.
const DefaultTimeout = 250 * time.Millisecond

// DefaultBatchTimeout bounds an AllowBatch call when Options.BatchTimeout
// is zero. A batch is one message each way and one store round trip for
// every item, so it takes longer than one decision as it grows: batches of
// 1,000 measured a p99 of about 140ms on a loaded two-core machine
// (docs/performance.md), and a batch may hold 10,000.
const DefaultBatchTimeout = 2 * time.Second

// Options configure a Client.
type Options struct {
	// Timeout bounds every decision of Allow and of a Stream: the deadline
	// is the earlier of the caller's and now+Timeout. 0 means
	// DefaultTimeout.
	Timeout time.Duration
	// BatchTimeout bounds every AllowBatch call in the same way, whatever
	// its size. 0 means DefaultBatchTimeout.
	BatchTimeout time.Duration
	// CoalesceDelay bounds how long Allow may hold a call to send it
	// together with other callers' (coalescing: see Client.Allow). 0 means
	// DefaultCoalesceDelay; negative turns coalescing off, so that every
	// Allow is a unary call of its own.
	CoalesceDelay time.Duration
	// CoalesceMaxItems bounds the calls sent together in one message. 0
	// means DefaultCoalesceMaxItems; at most MaxBatch.
	CoalesceMaxItems int
	// CoalesceInFlight is how many of the Client's calls may be on the
	// wire before the next one waits to be sent with others. 0 means
	// DefaultCoalesceInFlight.
	CoalesceInFlight int
	// DialOptions are added after the defaults (plaintext transport: the
	// agent is a sidecar on loopback); a later WithTransportCredentials
	// replaces the default one.
	DialOptions []grpc.DialOption
}

// Request asks whether one request may proceed. Give Descriptors (matched
// against every rule), or Rule and Subject (one named rule), not both.
type Request struct {
	Descriptors map[string]string
	Rule        string
	Subject     string
	// Cost in tokens; 0 means 1.
	Cost float64
	// RequestID makes retries safe: a repeated id returns the recorded
	// decision and charges nothing.
	RequestID string
}

// Reason says why a decision came out as it did.
type Reason string

// Reasons, as the agent names them.
const (
	ReasonOK          Reason = "ok"          // every matching rule admitted
	ReasonOverLimit   Reason = "over_limit"  // a rule's quota is spent: 429
	ReasonNoRule      Reason = "no_rule"     // nothing matched: admitted
	ReasonShadow      Reason = "shadow"      // a shadow rule would have denied: admitted
	ReasonUnavailable Reason = "unavailable" // the agent's store is unreachable: fail_open admitted, fail_closed denied (503)
	ReasonEmergency   Reason = "emergency"   // decided by the agent's local emergency bucket
	ReasonInvalid     Reason = "invalid"     // a malformed batch item (AllowBatch only)
)

var reasons = map[rationv1.Reason]Reason{
	rationv1.Reason_REASON_OK:          ReasonOK,
	rationv1.Reason_REASON_OVER_LIMIT:  ReasonOverLimit,
	rationv1.Reason_REASON_NO_RULE:     ReasonNoRule,
	rationv1.Reason_REASON_SHADOW:      ReasonShadow,
	rationv1.Reason_REASON_UNAVAILABLE: ReasonUnavailable,
	rationv1.Reason_REASON_EMERGENCY:   ReasonEmergency,
	rationv1.Reason_REASON_INVALID:     ReasonInvalid,
}

// Decision is the agent's answer.
type Decision struct {
	Allowed    bool
	RetryAfter time.Duration // when denied: until a retry can succeed; 0 when none can (rate 0)
	Remaining  int64         // tokens left in the deciding rule's bucket
	Limit      int64         // the deciding rule's burst
	Rate       float64       // the deciding rule's refill rate, tokens per second
	Reset      time.Duration // until the deciding rule's bucket is full
	Rule       string        // the deciding rule; "" when none matched
	Reason     Reason
	// Err is set, wrapping ErrInvalid, for a malformed AllowBatch item.
	Err error
}

// Status is the HTTP status a gateway answers for the decision: 200
// admitted, 503 when the agent's store is unreachable and the rule fails
// closed, 429 otherwise.
func (d Decision) Status() int {
	switch {
	case d.Allowed:
		return 200
	case d.Reason == ReasonUnavailable:
		return 503
	default:
		return 429
	}
}

// Client calls a gateway-agent's gRPC API (ration.v1.RateLimiter). It holds
// one connection, multiplexing concurrent calls over it, and is safe for
// concurrent use; create one per agent and share it.
type Client struct {
	conn         *grpc.ClientConn
	rl           rationv1.RateLimiterClient
	timeout      time.Duration
	batchTimeout time.Duration
	co           *coalescer // nil when coalescing is off
}

// New returns a client of the agent at target (host:port, or any gRPC
// target such as unix:///run/ration.sock). It does not connect until the
// first call.
func New(target string, opts Options) (*Client, error) {
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("ration: Options.Timeout %v is negative", opts.Timeout)
	}
	if opts.BatchTimeout < 0 {
		return nil, fmt.Errorf("ration: Options.BatchTimeout %v is negative", opts.BatchTimeout)
	}
	if opts.CoalesceMaxItems < 0 || opts.CoalesceMaxItems > MaxBatch {
		return nil, fmt.Errorf("ration: Options.CoalesceMaxItems %d: want 0 to %d", opts.CoalesceMaxItems, MaxBatch)
	}
	if opts.CoalesceInFlight < 0 {
		return nil, fmt.Errorf("ration: Options.CoalesceInFlight %d is negative", opts.CoalesceInFlight)
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.BatchTimeout == 0 {
		opts.BatchTimeout = DefaultBatchTimeout
	}
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts.DialOptions...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("ration: agent %s: %w", target, err)
	}
	c := &Client{conn: conn, rl: rationv1.NewRateLimiterClient(conn), timeout: opts.Timeout, batchTimeout: opts.BatchTimeout}
	if opts.CoalesceDelay >= 0 {
		if opts.CoalesceDelay == 0 {
			opts.CoalesceDelay = DefaultCoalesceDelay
		}
		if opts.CoalesceMaxItems == 0 {
			opts.CoalesceMaxItems = DefaultCoalesceMaxItems
		}
		if opts.CoalesceInFlight == 0 {
			opts.CoalesceInFlight = DefaultCoalesceInFlight
		}
		c.co = newCoalescer(c.rl, opts)
	}
	return c, nil
}

// Close releases the connection. Allow calls still waiting fail with
// ErrUnavailable ("client closed"), as does every later call; Close
// returns once the calls on the wire have ended.
func (c *Client) Close() error {
	if c.co != nil {
		return c.co.close(c.conn.Close)
	}
	return c.conn.Close()
}

// Allow decides one request. Errors wrap ErrInvalid or ErrUnavailable, or
// are the caller's context error.
//
// Concurrent calls coalesce (unless Options.CoalesceDelay is negative):
// while Options.CoalesceInFlight of the Client's calls are on the wire, a
// new call waits, at most Options.CoalesceDelay, to go out in one
// AllowBatch call with the others waiting, which the agent decides in one
// round trip to its store. Each caller still gets its own decision or
// error, within its own deadline: an invalid request fails alone with
// ErrInvalid, and a batch that fails as a whole fails each of its callers
// with ErrUnavailable. A caller whose context ends while its call waits
// returns at once, and its request is never sent (nothing is charged);
// once sent, the request is decided and charged as a unary call whose
// caller gave up after sending it may be, and the caller returns at once
// without the answer. A call with outgoing gRPC metadata in its context,
// or a string that is not UTF-8, is always sent alone.
func (c *Client) Allow(ctx context.Context, req Request) (Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var resp *rationv1.AllowResponse
	var err error
	if c.co != nil && coalescable(ctx, &req) {
		resp, err = c.co.allow(ctx, toProto(req))
		if err == nil && resp.GetReason() == rationv1.Reason_REASON_INVALID {
			return Decision{}, fmt.Errorf("%w: %s", ErrInvalid, resp.GetError())
		}
	} else {
		resp, err = c.rl.Allow(ctx, toProto(req))
		if err != nil {
			err = callError(ctx, err)
		}
	}
	if err != nil {
		return Decision{}, err
	}
	return fromProto(resp), nil
}

// AllowBatch decides many independent requests in one call (at most 10,000;
// the agent charges them in one round trip to its store), within
// Options.BatchTimeout. Decisions come in order; a malformed item has
// Reason ReasonInvalid and Err set, and does not fail the others.
func (c *Client) AllowBatch(ctx context.Context, reqs []Request) ([]Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, c.batchTimeout)
	defer cancel()
	in := &rationv1.AllowBatchRequest{Requests: make([]*rationv1.AllowRequest, len(reqs))}
	for i, r := range reqs {
		in.Requests[i] = toProto(r)
	}
	resp, err := c.rl.AllowBatch(ctx, in)
	if err != nil {
		return nil, callError(ctx, err)
	}
	if len(resp.GetResponses()) != len(reqs) {
		return nil, fmt.Errorf("%w: %d answers for %d requests", ErrUnavailable, len(resp.GetResponses()), len(reqs))
	}
	out := make([]Decision, len(reqs))
	for i, r := range resp.GetResponses() {
		out[i] = fromProto(r)
		if out[i].Reason == ReasonInvalid {
			out[i].Err = fmt.Errorf("%w: %s", ErrInvalid, r.GetError())
		}
	}
	return out, nil
}

// callError maps a gRPC error to the package's errors.
func callError(ctx context.Context, err error) error {
	st, _ := status.FromError(err)
	switch {
	case st.Code() == codes.InvalidArgument:
		return fmt.Errorf("%w: %s", ErrInvalid, st.Message())
	case st.Code() == codes.Canceled && errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("ration: %w", context.Canceled)
	case st.Code() == codes.DeadlineExceeded || errors.Is(ctx.Err(), context.DeadlineExceeded):
		// The agent may reset the stream at the deadline a moment before
		// this side's timer fires: either way, say so (errors.Is works).
		return fmt.Errorf("%w: %w", ErrUnavailable, context.DeadlineExceeded)
	default:
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
}

func toProto(r Request) *rationv1.AllowRequest {
	return &rationv1.AllowRequest{
		Descriptors: r.Descriptors,
		Rule:        r.Rule,
		Subject:     r.Subject,
		Cost:        r.Cost,
		RequestId:   r.RequestID,
	}
}

func fromProto(r *rationv1.AllowResponse) Decision {
	return Decision{
		Allowed:    r.GetAllowed(),
		RetryAfter: time.Duration(r.GetRetryAfterMs()) * time.Millisecond,
		Remaining:  r.GetRemaining(),
		Limit:      r.GetLimit(),
		Rate:       r.GetRate(),
		Reset:      time.Duration(r.GetResetMs()) * time.Millisecond,
		Rule:       r.GetRule(),
		Reason:     reasons[r.GetReason()],
	}
}
