package coordclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// LeaderTrailer is the gRPC trailer in which a node that cannot serve
// (a follower, or a leader not yet ready) names the leader's gRPC address.
// It is empty when the node knows no leader.
const LeaderTrailer = "ration-leader"

// Options tune a Client. The zero value is usable: every zero field
// takes the default named in its comment.
type Options struct {
	// CallTimeout bounds one attempt (default 500ms): a committed Raft
	// entry takes milliseconds, so an attempt that runs longer is talking to
	// a node that is paused, partitioned or overloaded, and the next member
	// should be tried while the caller's context (which bounds the whole
	// call, retries included) still has time. An attempt as long as the
	// whole call would pin a silent leader.
	CallTimeout time.Duration
	// MaxAttempts bounds the attempts of one call (default 10), redirects
	// to the leader included.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the jittered exponential pause
	// between attempts that did not learn a new leader (defaults 10ms, 1s).
	BackoffMin, BackoffMax time.Duration
	// DialOptions replace the default (plaintext: coordinators are reached
	// on a private network, or through a mesh that adds TLS).
	DialOptions []grpc.DialOption
	Logger      *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.CallTimeout <= 0 {
		o.CallTimeout = 500 * time.Millisecond
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 10
	}
	if o.BackoffMin <= 0 {
		o.BackoffMin = 10 * time.Millisecond
	}
	if o.BackoffMax < o.BackoffMin {
		o.BackoffMax = max(time.Second, o.BackoffMin)
	}
	if o.DialOptions == nil {
		o.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	// gRPC's default reconnect backoff grows to two minutes: a coordinator
	// restarted after a few failed dials would then stay unreachable to
	// this client for far longer than a lease lives. Reconnect within a
	// second instead (a dial is cheap next to a lease lapsing).
	o.DialOptions = append([]grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: time.Second,
	})}, o.DialOptions...)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Client calls a coordinator cluster's Leases service for an agent: it
// finds the leader, follows the "ration-leader" trailer, retries on
// UNAVAILABLE with bounded backoff, and keeps one connection per address.
// It is safe for concurrent use.
//
// Retrying a Renew or Release is safe because the request keeps its
// (holder, seq): the state machine applies a sequence number once and
// answers a repeat from what it recorded.
type Client struct {
	opts  Options
	addrs []string

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	// streams holds each connection's RenewStream; unaryOnly the
	// connections whose node answered it UNIMPLEMENTED, and when.
	streams   map[*grpc.ClientConn]*renewStream
	unaryOnly map[*grpc.ClientConn]time.Time
	leader    string // last address that answered, or that a trailer named
	next      int    // round-robin position in addrs when no leader is known
	closed    bool
}

// maxConns bounds the connections a Client keeps: the configured addresses
// plus leaders learned from trailers. Beyond it, a learned address other
// than the current leader is closed first (a cluster has far fewer nodes;
// the bound only matters if trailers keep naming new addresses).
const maxConns = 64

// New returns a Client for the coordinators at addrs (gRPC
// addresses, any member: the client finds the leader). It dials lazily.
func New(addrs []string, opts Options) *Client {
	return &Client{
		opts:  opts.withDefaults(),
		addrs: append([]string(nil), addrs...),
		conns: make(map[string]*grpc.ClientConn),

		streams:   make(map[*grpc.ClientConn]*renewStream),
		unaryOnly: make(map[*grpc.ClientConn]time.Time),
	}
}

// Renew sends req to the leader, retrying as described on Client. It goes
// as a message on the connection's RenewStream (renewstream.go), or as a
// unary call to a node that has none. req must not change after the call:
// an attempt that gave up may still send it (it is then answered from the
// holder's record of that seq, or refused as stale).
func (c *Client) Renew(ctx context.Context, req *rationv1.RenewRequest) (*rationv1.RenewResponse, error) {
	return unary(ctx, c, "renew", func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*rationv1.RenewResponse, error) {
		return c.renewOn(ctx, cc, req, opts...)
	})
}

// Release sends req to the leader, retrying as described on Client.
func (c *Client) Release(ctx context.Context, req *rationv1.ReleaseRequest) (*rationv1.ReleaseResponse, error) {
	return unary(ctx, c, "release", func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*rationv1.ReleaseResponse, error) {
		return rationv1.NewLeasesClient(cc).Release(ctx, req, opts...)
	})
}

// unary sends one call to the leader, retrying as described on Client,
// and returns its answer.
func unary[Resp any](ctx context.Context, c *Client, what string, call func(context.Context, *grpc.ClientConn, ...grpc.CallOption) (Resp, error)) (Resp, error) {
	var resp Resp
	err := c.do(ctx, what, func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		var err error
		resp, err = call(ctx, cc, opts...)
		return err
	})
	return resp, err
}

// Leader returns the address the client currently sends to ("" before the
// first success or redirect).
func (c *Client) Leader() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

// Close closes every connection. Calls after Close fail with ErrStopped.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for a, cc := range c.conns {
		c.closeStream(cc)
		errs = append(errs, cc.Close())
		delete(c.conns, a)
	}
	return errors.Join(errs...)
}

type callFunc func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) error

func (c *Client) do(ctx context.Context, what string, call callFunc) error {
	target := c.first()
	if target == "" {
		return fmt.Errorf("coordinator client: %s: no addresses: %w", what, ErrInvalidRequest)
	}
	backoff := c.opts.BackoffMin
	var last error
	redirected := false
	for attempt := 1; ; attempt++ {
		cc, err := c.conn(target)
		if err != nil {
			return fmt.Errorf("coordinator client: %s: %w", what, err)
		}
		actx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
		var trailer metadata.MD
		err = call(actx, cc, grpc.Trailer(&trailer))
		cancel()
		if err == nil {
			c.setLeader(target)
			return nil
		}
		last = err
		if ctx.Err() != nil {
			// The caller's own deadline or cancel ended the attempt: say
			// so, whatever status gRPC turned it into, so callers can
			// branch on context.DeadlineExceeded and context.Canceled.
			return fmt.Errorf("coordinator client: %s: %w (last error: %w)", what, ctx.Err(), last)
		}
		if !retryable(ctx, err) || attempt >= c.opts.MaxAttempts {
			break
		}
		hint := ""
		if v := trailer.Get(LeaderTrailer); len(v) > 0 {
			hint = v[0]
		}
		c.opts.Logger.Debug("coordinator call failed, retrying", "call", what, "addr", target,
			"leader_hint", hint, "attempt", attempt, "err", err)
		if hint != "" && hint != target {
			// A new leader to try: go at once, that is what the trailer is
			// for; but not twice in a row, so that two nodes naming each
			// other during an election do not burn the attempts in a spin.
			target = hint
			c.setLeader(hint)
			if !redirected {
				redirected = true
				continue
			}
		}
		redirected = false
		if hint == "" {
			// Nobody knows a leader (an election): try the next member.
			target = c.rotate(target)
		}
		// else: the target is the leader but not ready yet, or a second
		// redirect in a row: wait, then try it.
		pause := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, c.opts.BackoffMax)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("coordinator client: %s: %w (last error: %w)", what, ctx.Err(), last)
		case <-t.C:
		}
	}
	return fmt.Errorf("coordinator client: %s: %w", what, last)
}

// retryable: UNAVAILABLE (no leader here, node down, connection refused)
// and an attempt that ran out of its own time while the call has time left.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

func (c *Client) first() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader != "" {
		return c.leader
	}
	if len(c.addrs) == 0 {
		return ""
	}
	return c.addrs[c.next%len(c.addrs)]
}

func (c *Client) setLeader(addr string) {
	c.mu.Lock()
	c.leader = addr
	c.mu.Unlock()
}

// rotate forgets the leader and returns the configured address after cur.
func (c *Client) rotate(cur string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader == cur {
		c.leader = ""
	}
	c.next++
	a := c.addrs[c.next%len(c.addrs)]
	if a == cur && len(c.addrs) > 1 {
		c.next++
		a = c.addrs[c.next%len(c.addrs)]
	}
	return a
}

func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrStopped
	}
	if cc, ok := c.conns[addr]; ok {
		return cc, nil
	}
	if len(c.conns) >= maxConns {
		for a, cc := range c.conns {
			if a != c.leader && !slices.Contains(c.addrs, a) {
				c.closeStream(cc)
				cc.Close()
				delete(c.conns, a)
				break
			}
		}
	}
	cc, err := grpc.NewClient(addr, c.opts.DialOptions...)
	if err != nil {
		return nil, fmt.Errorf("%w: address %q: %w", ErrInvalidRequest, addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// AddVoter asks the leader to add a server (what -join does). The Client
// must be given admin addresses (-admin): a lease port serves no Admin.
func (c *Client) AddVoter(ctx context.Context, req *rationv1.AddVoterRequest) (*rationv1.MembershipResponse, error) {
	return unary(ctx, c, "add voter", func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*rationv1.MembershipResponse, error) {
		return rationv1.NewAdminClient(cc).AddVoter(ctx, req, opts...)
	})
}

// Status asks a member for its view of the group: its Raft
// configuration, and the leader it follows (what -join pins before it asks
// to be added).
func (c *Client) Status(ctx context.Context) (*rationv1.StatusResponse, error) {
	return unary(ctx, c, "status", func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*rationv1.StatusResponse, error) {
		return rationv1.NewAdminClient(cc).Status(ctx, &rationv1.StatusRequest{}, opts...)
	})
}

// RemoveServer asks the leader to remove a server from the cluster.
func (c *Client) RemoveServer(ctx context.Context, req *rationv1.RemoveServerRequest) (*rationv1.MembershipResponse, error) {
	return unary(ctx, c, "remove server", func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*rationv1.MembershipResponse, error) {
		return rationv1.NewAdminClient(cc).RemoveServer(ctx, req, opts...)
	})
}

// AllowMember asks the leader to register a server id that may then add
// itself with its own certificate (coordinator members allow).
func (c *Client) AllowMember(ctx context.Context, req *rationv1.AllowMemberRequest) (*rationv1.MembershipResponse, error) {
	return unary(ctx, c, "allow member", func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*rationv1.MembershipResponse, error) {
		return rationv1.NewAdminClient(cc).AllowMember(ctx, req, opts...)
	})
}

// watchCheck is how often Watch checks that its stream is still on the
// leader the unary calls use: a stream to a node that was deposed (or
// paused) stays silent rather than fail, and the renewals find the new
// leader first.
const watchCheck = 500 * time.Millisecond

// Watch keeps holder's nudge stream (Leases.Watch) open to the leader until
// ctx is done, and calls fn with the quotas of every nudge, from one
// goroutine; fn must not block. It follows the leader as the unary calls
// do: a trailer naming the leader, else the next member after a jittered
// backoff; and it moves to the leader the unary calls found when that
// differs. When a stream is (re)established fn is called with no quotas:
// nudges sent while there was none are lost, and the holder may renew
// what it holds to catch up. It returns ctx's error.
func (c *Client) Watch(ctx context.Context, holder string, fn func([]*rationv1.QuotaRef)) error {
	backoff := c.opts.BackoffMin
	for ctx.Err() == nil {
		target := c.first()
		if target == "" {
			return fmt.Errorf("coordinator client: watch: no addresses: %w", ErrInvalidRequest)
		}
		hint, got, err := c.watchOnce(ctx, target, holder, fn)
		if ctx.Err() != nil {
			break
		}
		if status.Code(err) == codes.Unimplemented {
			// A coordinator older than Watch: shares move at renew points
			// only, as they did then. Nothing to retry.
			c.opts.Logger.Warn("coordinator has no lease watch stream (older version): shares move at renew points until it is upgraded", "addr", target)
			return fmt.Errorf("coordinator client: watch: %w", err)
		}
		c.opts.Logger.Debug("lease watch stream ended", "addr", target, "leader_hint", hint, "err", err)
		switch {
		case hint != "" && hint != target:
			c.setLeader(hint)
			backoff = c.opts.BackoffMin
			continue
		case got:
			backoff = c.opts.BackoffMin
		case hint == "" && status.Code(err) == codes.Unavailable:
			c.rotate(target)
		}
		pause := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, c.opts.BackoffMax)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
	return ctx.Err()
}

// watchOnce runs one stream to target until it ends, or until the unary
// calls have moved to another leader. got reports that the stream was
// established.
func (c *Client) watchOnce(ctx context.Context, target, holder string, fn func([]*rationv1.QuotaRef)) (hint string, got bool, err error) {
	cc, err := c.conn(target)
	if err != nil {
		return "", false, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := rationv1.NewLeasesClient(cc).Watch(sctx, &rationv1.WatchRequest{Holder: holder})
	if err != nil {
		return "", false, err
	}
	go func() {
		t := time.NewTicker(watchCheck)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				if l := c.Leader(); l != "" && l != target {
					cancel()
					return
				}
			}
		}
	}()
	for {
		msg, err := stream.Recv()
		if err != nil {
			if v := stream.Trailer().Get(LeaderTrailer); len(v) > 0 {
				hint = v[0]
			}
			return hint, got, err
		}
		if !got {
			got = true
			c.setLeader(target)
		}
		fn(msg.GetQuotas())
	}
}
