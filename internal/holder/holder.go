package holder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Item error prefixes the coordinator answers with (coordinator.ItemErr*);
// repeated here because the holder depends on the wire contract, not on the
// coordinator's package.
const (
	itemErrLeaseExpired = "lease expired or unknown"
	itemErrUnknownQuota = "unknown quota"
	itemErrRetryGrant   = "grant answer lost on retry"
	itemErrInvalid      = "invalid item"
)

// Client is what the holder needs of the coordinators (coordclient.Client).
type Client interface {
	Renew(ctx context.Context, req *rationv1.RenewRequest) (*rationv1.RenewResponse, error)
	Release(ctx context.Context, req *rationv1.ReleaseRequest) (*rationv1.ReleaseResponse, error)
}

// Watcher is the optional part of a Client: the leader's stream of nudges
// (coordclient.Client.Watch). With it, shares move in round trips: a quota
// the leader nudges is renewed at once. Without it, at renew points only.
type Watcher interface {
	Watch(ctx context.Context, holder string, fn func([]*rationv1.QuotaRef)) error
}

// Options tune a Leases.
type Options struct {
	Client Client
	// Holder is this agent's configured id. The holder name on the wire is
	// "<Holder>/<Incarnation>": one process is one holder, whatever ids
	// operators give, so two processes never spend one lease.
	Holder string
	// Incarnation tells this process from every other one with the same
	// Holder (default: 64 random bits in hex, drawn at New).
	Incarnation string
	Region      string
	// Drift is rho, the bound on clock-rate drift between this host and the
	// coordinators (default 0.001: 1000 ppm, ten times what NTP-disciplined
	// clocks drift).
	Drift float64
	// Pause is m, the longest pause between a validity check and the
	// admission it allows (scheduling, GC). Default 50ms.
	Pause time.Duration
	// RenewAt is the renew point: the fraction of a lease's validity after
	// which it is renewed (default 0.5).
	RenewAt float64
	// ColdStart bounds how long the first decision for a quota waits for its
	// first grant (default 100ms). Later decisions never wait.
	ColdStart time.Duration
	// RequestTimeout bounds one Renew or Release call (default 2s). A
	// Client that bounds its calls itself may be given a negative one: no
	// call then sets a deadline of its own (internal/sim, where a timer per
	// round was a twentieth of a run's time).
	RequestTimeout time.Duration
	// IdleAfter releases a quota unused for this long (default 1m).
	IdleAfter time.Duration
	// Tick is the renewal loop's resolution (default 20ms): it sleeps
	// until the next round is due, at least Tick and at most a second.
	Tick time.Duration
	// EarlyGap is the shortest time between two early renewals of one
	// quota (nudged, confirming a shrink, or run dry), default 50ms.
	EarlyGap time.Duration
	// MaxItems and MaxRequestBytes split one round into several requests
	// (defaults 1000 items, 1 MiB), within what a coordinator accepts.
	MaxItems        int
	MaxRequestBytes int
	Logger          *slog.Logger
	Registry        prometheus.Registerer
	// Clock, when set, is the holder's monotonic clock in microseconds
	// (default: time since New). The simulator (internal/sim) gives each
	// agent its own drifting clock; a process keeps the default.
	Clock func() int64
	// SortedScans makes every full scan look at quotas in (rule, subject)
	// order instead of map order, so that one seed of the simulator is one
	// exact run. It costs a sort per scan; processes leave it off.
	SortedScans bool
	// Rules, when set, returns the agent's rules in force: every grant is
	// held to its rule's shape as they give it now (a reload may change
	// it), else as they gave it when the quota was added.
	Rules func() *rules.Set
}

func (o *Options) defaults() error {
	if o.Client == nil {
		return errors.New("holder: no coordinator client")
	}
	if o.Holder == "" {
		return errors.New("holder: empty holder id")
	}
	if o.Drift == 0 {
		o.Drift = 0.001
	}
	if o.Pause == 0 {
		o.Pause = 50 * time.Millisecond
	}
	if o.RenewAt == 0 {
		o.RenewAt = 0.5
	}
	if o.ColdStart == 0 {
		o.ColdStart = 100 * time.Millisecond
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 2 * time.Second
	}
	if o.IdleAfter == 0 {
		o.IdleAfter = time.Minute
	}
	if o.Tick == 0 {
		o.Tick = 20 * time.Millisecond
	}
	if o.EarlyGap == 0 {
		o.EarlyGap = 50 * time.Millisecond
	}
	if o.MaxItems == 0 {
		o.MaxItems = 1000
	}
	if o.MaxRequestBytes == 0 {
		o.MaxRequestBytes = 1 << 20
	}
	if o.Incarnation == "" {
		o.Incarnation = fmt.Sprintf("%016x", rand.Uint64())
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	var errs []error
	if !(o.Drift > 0 && o.Drift < 0.5) {
		errs = append(errs, fmt.Errorf("holder: drift %v must be in (0, 0.5)", o.Drift))
	}
	if o.Pause < 0 {
		errs = append(errs, fmt.Errorf("holder: pause %v must not be negative", o.Pause))
	}
	if !(o.RenewAt > 0 && o.RenewAt < 1) {
		errs = append(errs, fmt.Errorf("holder: renew point %v must be in (0, 1)", o.RenewAt))
	}
	if strings.Contains(o.Holder, "/") || o.Holder == "region" {
		errs = append(errs, fmt.Errorf("holder: id %q must not contain '/' nor be \"region\" (the wire name is <id>/<incarnation>)", o.Holder))
	}
	if n := len(o.Holder) + 1 + len(o.Incarnation); n > lease.MaxNameLen {
		errs = append(errs, fmt.Errorf("holder: id %q is %d bytes with its incarnation, at most %d", o.Holder, n, lease.MaxNameLen))
	}
	if o.MaxItems < 1 || o.MaxItems > lease.MaxItems {
		errs = append(errs, fmt.Errorf("holder: max items %d must be in [1, %d]", o.MaxItems, lease.MaxItems))
	}
	return errors.Join(errs...)
}

// Leases is the agent's set of leases. It implements agent.Leases.
type Leases struct {
	o     Options
	name  string    // the holder name on the wire: <id>/<incarnation>
	start time.Time // monotonic origin of Now
	m     *metrics

	// quotas maps rule -> *sync.Map(subject -> *quota). The outer map is
	// copied on write (rules are few and change rarely); decisions read it
	// and the inner map without locks.
	mu     sync.Mutex
	quotas atomic.Pointer[map[string]*sync.Map]
	count  int
	// fresh are quotas added since the loop last looked: their grants go
	// first, even in the middle of a round split into several requests.
	// early are quotas that may want an early renewal (nudged, shrunk, run
	// dry): the loop looks at them without scanning every quota.
	fresh []*quota
	early []*quota

	wake chan struct{}
	// nextScan is when the loop next looks at every quota (the earliest
	// renew point, or rescan); between scans it looks only at fresh and
	// early quotas.
	nextScan int64
	seq      uint64 // next sequence number; only the loop touches it
	// maxItems is MaxItems, halved each time a coordinator refuses a
	// request as too large (its own limit is lower).
	maxItems int
	// retryAt delays the next round after a failed Renew (backoff), on Now.
	retryAt int64
	backoff time.Duration

	// down is when renewals started failing (unix nanos), 0 while healthy;
	// lastErr (a string) the last failure, for Cause.
	down    atomic.Int64
	lastErr atomic.Value
	// linked: the coordinators answered once (Linked).
	linked atomic.Bool
	// held are the loans of held spends (SpendHeld) not repaid yet.
	held heldLoans
	// stepped is when the loop last took a step (unix nanos): woke for a
	// round, or started a call. A live loop steps at least once a second
	// (maxSleep) or once a RequestTimeout; Stepped lets a watchdog tell one
	// that hangs.
	stepped atomic.Int64
}

// New builds a Leases; call Run to start renewing.
func New(o Options) (*Leases, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	l := &Leases{
		o:     o,
		name:  o.Holder + "/" + o.Incarnation,
		start: time.Now(),
		wake:  make(chan struct{}, 1),
		// A new incarnation is a new holder: its numbers start at its
		// clock (lease.FirstSeq), far below what a coordinator refuses.
		seq:      lease.FirstSeq(o.wallMicros()),
		maxItems: o.MaxItems,
	}
	l.m = newMetrics(o.Registry)
	l.quotas.Store(&map[string]*sync.Map{})
	return l, nil
}

// wallMicros is the clock sequence numbers are measured against
// (lease.FirstSeq, lease.PastStale): microseconds since the epoch, or
// Clock when set (the simulator's coordinators read the same one).
func (o *Options) wallMicros() int64 {
	if o.Clock != nil {
		return o.Clock()
	}
	return time.Now().UnixMicro()
}

// Name is the holder name this process uses on the wire:
// "<configured id>/<incarnation>".
func (l *Leases) Name() string { return l.name }

// Now is the holder's monotonic clock in microseconds. Callers read it once
// per batch of decisions and pass it to Take.
func (l *Leases) Now() int64 {
	if l.o.Clock != nil {
		return l.o.Clock()
	}
	return int64(time.Since(l.start) / time.Microsecond)
}

// validity turns a lease term into how long after sending the holder may
// spend it.
func (l *Leases) validity(term int64) int64 {
	return lease.AgentValidity(term, l.o.Drift, l.o.Pause.Microseconds())
}

// DownFor reports how long renewals have been failing (0 while healthy):
// the start of the episode an emergency policy is measured from.
func (l *Leases) DownFor() time.Duration {
	d := l.down.Load()
	if d == 0 {
		return 0
	}
	return time.Since(time.Unix(0, d))
}

// Run renews leases until ctx is done, then releases them all (within
// RequestTimeout) so their unused budget goes back to the pool. With a
// Client that is also a Watcher it keeps the leader's nudge stream open.
func (l *Leases) Run(ctx context.Context) {
	if w, ok := l.o.Client.(Watcher); ok {
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = w.Watch(wctx, l.name, l.nudge)
		}()
		defer func() { cancel(); <-done }()
	}
	l.o.Logger.Info("lease holder started", "holder", l.name)
	t := time.NewTimer(l.o.Tick)
	defer t.Stop()
	for {
		l.stepped.Store(time.Now().UnixNano())
		select {
		case <-ctx.Done():
			// Holds over by now no longer keep their leases from going back.
			l.repayHeld(l.Now())
			rctx, cancel := l.callCtx(context.WithoutCancel(ctx))
			l.release(rctx, l.snapshot())
			cancel()
			return
		case <-t.C:
		case <-l.wake:
		}
		l.round(ctx)
		// Reset discards a firing the wake raced with (Go 1.23 timers).
		t.Reset(l.sleep())
	}
}

// maxSleep bounds how long the loop sleeps with nothing due, so that a
// watchdog sees it step (Stepped) at least this often.
const maxSleep = time.Second

// sleep is how long Run waits before its next round: until Due, within
// [Tick, maxSleep]. Work that arrives meanwhile (a new quota, a flagged
// or nudged one) wakes the loop at once (kick); everything else a round
// does is at Due, which the simulator drives Round by. An idle agent woke
// fifty times a second on a fixed Tick, most of its idle CPU.
func (l *Leases) sleep() time.Duration {
	d := time.Duration(l.Due()-l.Now()) * time.Microsecond
	return min(max(d, l.o.Tick), maxSleep)
}

// callCtx is ctx bounded by RequestTimeout for one Renew or Release call,
// or ctx itself when the Client bounds its calls (RequestTimeout < 0).
func (l *Leases) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	l.stepped.Store(time.Now().UnixNano())
	if l.o.RequestTimeout < 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, l.o.RequestTimeout)
}

// Stepped is when the renewal loop last took a step (woke up, or started
// a Renew or Release call); zero before Run. A loop that is alive steps at
// least every second (maxSleep), or every RequestTimeout while a call is
// out.
func (l *Leases) Stepped() time.Time {
	n := l.stepped.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Round runs one round of the renewal loop, what Run does at each tick,
// for a caller that drives time itself (internal/sim, with Options.Clock)
// instead of calling Run. Client calls are made from the calling goroutine.
func (l *Leases) Round(ctx context.Context) { l.round(ctx) }

// Due is the earliest time on Now at which a Round has work: at once
// (after any backoff) when new or flagged quotas wait, else the next full
// scan; and the end of the first hold of a held spend not repaid yet. Run need not ask: it looks at every tick.
func (l *Leases) Due() int64 {
	l.mu.Lock()
	waiting := len(l.fresh)+len(l.early) > 0
	l.mu.Unlock()
	due := max(l.nextScan, l.retryAt)
	if waiting {
		due = l.retryAt
	}
	if h := l.held.due(); h != 0 {
		// Repaying is local: no backoff delays it.
		due = min(due, h)
	}
	return due
}
