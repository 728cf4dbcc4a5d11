package holder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/bucket"
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

const (
	// failedRetry spaces out asking again for a quota the coordinator did
	// not know.
	failedRetry = 10 * time.Second
	// maxBackoff caps the pause between failed Renew rounds. Leases live for
	// seconds, so a longer pause would let them lapse needlessly.
	maxBackoff = time.Second
	// demandWindow is the shortest window a demand is measured over: a
	// renewal soon after the last one blends in the previous estimate for
	// the rest of the window, so early renewals do not report noise.
	demandWindow = 250 * time.Millisecond
	// rescan bounds the time between two scans of every quota (idle
	// detection, demands that fell); renew points, nudges, dry slices and
	// new quotas trigger looks of their own.
	rescan = 250 * time.Millisecond
	// sampleRequests is how many requests a demand window must hold to be
	// closed before 8 windows have passed.
	sampleRequests = 8
	// confirmShrink is the part of a lease's rate or cap (or its owed
	// tokens, of its cap) a shrink must free to be confirmed at once
	// without a nudge.
	confirmShrink = 0.15
	// dryHelped is how much a dry ask must grow a lease to count as having
	// helped (its backoff starts over).
	dryHelped = 1.5
	// itemBytes estimates one renew item's encoded size beyond its rule and
	// subject, for splitting requests by size.
	itemBytes = 64
)

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
	// Tick is the renewal loop's resolution (default 20ms).
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

// quota is one leased (rule, subject) of this agent.
type quota struct {
	rule    string
	subject string
	id      string  // coordinator.QuotaID
	rate    float64 // the rule's r, as this agent's rules say

	mu        sync.Mutex
	h         lease.Holding
	requested float64 // tokens asked for since the last sample (admitted or not)
	lastUsed  int64
	// recent is the smoothed demand of the closed sample windows, the last
	// of which ended at sampledAt (created: when the quota was).
	recent             float64
	sampledAt, created int64
	// demand is the last reported demand (tokens/s) and reportedAt when;
	// sinceReport the tokens asked for since then (admitted or not).
	demand      float64
	reportedAt  int64
	sinceReport float64
	// Reasons to renew before the renew point: the leader nudged it, the
	// last answer shrank it (confirm at once, giving back the excess), or
	// a request found the slice dry.
	nudged, confirm, dry bool
	// sentAt is when a renewal was last sent; dryAt the earliest next ask
	// of a dry slice, and dryGap the current spacing of those asks,
	// doubled while they bring nothing.
	sentAt, dryAt int64
	dryGap        int64
	dryAsk        bool // the last request sent was a dry ask
	// sentNudged: the last request was sent because the leader nudged.
	sentNudged bool
	failed     string // an item error (unknown quota, invalid), logged once
	// failedAt is when; a quota the coordinator cannot ever accept
	// (invalid) is never asked again.
	failedAt  int64
	invalid   bool
	ready     chan struct{} // closed once the first answer (grant or error) arrived
	readyOnce sync.Once
	// got is set when ready is closed: decisions test it (an atomic load)
	// instead of selecting on ready, which costs more on every decision.
	got atomic.Bool
	// coldUntil ends the cold start: until then (ColdStart after the quota
	// was added) a decision that finds no first answer yet waits for it.
	// It is one deadline for every decision of the quota, so decisions
	// that wait for several new quotas (a batch) wait out one cold start
	// in all, not one per quota.
	coldUntil int64

	// With lease.default_share (see shared.go). own: this quota's own
	// lease is asked for (always, without a default share; for a subject
	// of a rule with one, once its copy of the default lease ran dry).
	own bool
	// ownUsed is when a decision last needed the own lease (its copy could
	// not pay); an own lease not needed for IdleAfter is given back.
	ownUsed int64
	// A subject's copy of its rule's default lease: cp mirrors every
	// command and answer of def's holding and is spent on this subject
	// alone. removed: forgotten by the loop (a decision that finds it
	// looks the subject up again).
	def     *quota
	cp      *lease.Holding
	removed bool
	// owesLess: cp owes less than def's holding (a shrink found it below
	// the new cap), so it may not be forgotten until the next command of
	// def's lease has given back the least of the two (see evictable).
	owesLess bool
	// The rule's default quota (subject rules.DefaultSubject): never spent
	// itself; copies are its subjects' copies (under its mu, which is
	// taken before theirs), and touched is when a subject last used it.
	isDefault bool
	copies    map[*quota]struct{}
	touched   atomic.Int64
}

func (q *quota) markReady() {
	q.readyOnce.Do(func() {
		q.got.Store(true)
		close(q.ready)
	})
}

// answered reports whether the first answer arrived.
func (q *quota) answered() bool { return q.got.Load() }

// demandAt estimates the demand at now: what was requested since the
// last sample, over at least demandWindow (the smoothed rate of earlier
// samples fills in the rest of it). It changes nothing; q.mu held.
func (q *quota) demandAt(now int64) float64 {
	if q.isDefault {
		// Every agent asks for the whole default part: its slice is spent
		// on each of its subjects, so the leader splits it evenly.
		return q.rate
	}
	el := now - q.sampledAt
	w := demandWindow.Microseconds()
	if el >= w {
		return q.requested / (float64(el) / 1e6)
	}
	return (q.requested + q.recent*float64(w-max(el, 0))/1e6) / (float64(w) / 1e6)
}

// sample closes a measurement window once it is at least demandWindow long
// and holds a few requests (or has run for 8 windows): the rate it saw,
// averaged half and half with the earlier ones, becomes recent. So a busy
// subject's demand follows a change within about two windows, while a slow
// subject's is measured over long enough windows not to read as noise.
func (q *quota) sample(now int64) {
	if q.isDefault {
		return
	}
	el := now - q.sampledAt
	w := demandWindow.Microseconds()
	if el < w || q.requested < sampleRequests && el < 8*w {
		return
	}
	r := q.requested / (float64(el) / 1e6)
	if q.sampledAt == q.created {
		q.recent = r // the first window: nothing earlier to average with
	} else {
		q.recent = (q.recent + r) / 2
	}
	q.requested, q.sampledAt = 0, now
}

// report takes the demand to send at now.
func (q *quota) report(now int64) float64 {
	d := q.demandAt(now)
	q.demand, q.reportedAt, q.sinceReport = d, now, 0
	return d
}

// fellZ is how many standard deviations (of a Poisson count at the
// reported rate) the tokens asked for since a report must fall short by
// before the demand counts as fallen: an agent that reported 32/s and saw
// nothing for 250ms (8 expected, 0 seen), or one that reported 29/s and saw
// 10/s for half a second, has a new demand; a subject of a few requests a
// second has to be quiet for longer. Steady Poisson arrivals fall that
// short about once in 160 looks.
const fellZ = 2.5

// fell reports whether the demand fell to less than half of what was last
// reported, judged on the tokens asked for since that report (see fellZ;
// not on one window's count: a demand of 20/s brings 5 per window, and
// requiring 8 per window left such a fall unreported until the renew
// point). A fall restarts the estimate from what arrived since the
// report, so that the early renewal reports the new demand rather than a
// smoothed mix that keeps most of the old one for several windows (and
// would not look like a fall to the region's leader, which passes the sum
// upstream). q.mu held.
func (q *quota) fell(now int64) bool {
	el := now - q.reportedAt
	if q.isDefault || el < demandWindow.Microseconds() {
		return false
	}
	expected := q.demand * float64(el) / 1e6
	if miss := expected - q.sinceReport; q.sinceReport >= expected/2 || miss*miss < fellZ*fellZ*expected {
		return false
	}
	q.recent = q.sinceReport / (float64(el) / 1e6)
	q.requested, q.sampledAt = 0, now
	return true
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

	// down is when renewals started failing (unix nanos), 0 while healthy.
	down atomic.Int64
	// stepped is when the loop last took a step (unix nanos): woke for a
	// round, or started a call. A live loop steps at least once a Tick or
	// once a RequestTimeout; Stepped lets a watchdog tell one that hangs.
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
		// A new incarnation is a new holder: its numbers start anywhere.
		seq:      1,
		maxItems: o.MaxItems,
	}
	l.m = newMetrics(o.Registry)
	l.quotas.Store(&map[string]*sync.Map{})
	return l, nil
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

// Take spends cost from the lease of (rule, subject) at now (from Now). ok
// is false when there is no valid lease: the caller applies the rule's
// failure policy. Until a quota's first answer arrives, its decisions wait
// for it, up to ColdStart after the quota was added (by the first of them
// or by Prepare); no other call does any I/O or waits.
func (l *Leases) Take(ctx context.Context, r *rules.Rule, subject string, cost float64, now int64) (res bucket.Result, ok bool) {
	res, _, ok = l.Spend(ctx, r, subject, cost, now)
	return res, ok
}

// Spend is Take, and reports where the tokens came from: a refund must go
// back there (Refund), and only while that lease holds them.
func (l *Leases) Spend(ctx context.Context, r *rules.Rule, subject string, cost float64, now int64) (res bucket.Result, src Source, ok bool) {
	if r.Lease.DefaultShare > 0 && subject != "" {
		if subject == rules.DefaultSubject {
			// The rule's default quota is never spent on itself: it is
			// every subject's. The agent refuses this name before it gets
			// here; no caller may make a quota its own copy.
			return bucket.Result{}, Source{}, false
		}
		return l.takeShared(ctx, r, subject, cost, now)
	}
	q := l.lookup(r.Name, subject)
	if q == nil {
		q = l.add(r.Name, subject, r.Rate, true)
	}
	now = l.waitFirst(ctx, q, now, math.MaxInt64)
	q.mu.Lock()
	q.count(cost, now)
	res, ok, flag := l.spendOwn(q, cost, now)
	src = q.ownSource()
	q.mu.Unlock()
	if flag {
		// The slice ran dry: the loop decides whether the demand is worth
		// asking for more at once.
		l.flag(q)
	}
	return res, src, ok
}

// Source is where a Spend took its tokens: a subject's own lease or its
// copy of the rule's default lease, and which lease that was. Refund
// needs it. The zero Source refunds nothing.
type Source struct {
	q  *quota
	cp *lease.Holding // the copy spent; nil for the own lease
	id uint64
}

// Shared reports whether the tokens came from the subject's copy of its
// rule's default lease (lease.default_share).
func (s Source) Shared() bool { return s.cp != nil }

// ownSource is the Source of a spend of q's own lease; q.mu held.
func (q *quota) ownSource() Source { return Source{q: q, id: q.h.Lease.ID} }

// copySource is the Source of a spend of q's copy; q.mu held.
func (q *quota) copySource() Source { return Source{q: q, cp: q.cp, id: q.cp.Lease.ID} }

// Ref is a quota of this holder found once, for a caller that decides the
// same (rule, subject) often: its Spend skips the lookup, the first-grant
// wait and the default-share branch of Leases.Spend. The zero Ref finds
// nothing.
type Ref struct {
	l *Leases
	q *quota
}

// Ref finds the quota of (r, subject) if this holder has added it (a
// first Spend adds it). A rule with lease.default_share has none: its
// subjects spend their copy of the default lease first (Spend).
func (l *Leases) Ref(r *rules.Rule, subject string) Ref {
	if r.Lease.DefaultShare > 0 {
		return Ref{}
	}
	q := l.lookup(r.Name, subject)
	if q == nil {
		return Ref{}
	}
	return Ref{l: l, q: q}
}

// Spend is Leases.Spend of ref's quota, now (Leases.Now, read here), when
// it can be decided on the quota's lease at once, with bucket.Result's fields a lease sets as
// results of their own (a Result is too large to return cheaply). ok is
// false, and nothing was spent or counted, when ref finds nothing, the
// first answer has not arrived, or the lease is not valid at now
// (expired, refused, or given back when the quota was forgotten for
// idleness). The caller then calls Leases.Spend, which waits for a first
// grant, adds the quota again, or reports that the rule's failure policy
// decides; and takes a new Ref.
func (ref Ref) Spend(cost float64) (allowed bool, remaining float64, reset, retryAfter time.Duration, ok bool) {
	if ref.q == nil || !ref.q.answered() {
		return false, 0, 0, 0, false
	}
	return ref.SpendAt(cost, ref.l.Now())
}

// SpendAt is Spend at now (from Leases.Now), for a caller that decides
// many requests at one reading of the clock (a batch).
func (ref Ref) SpendAt(cost float64, now int64) (allowed bool, remaining float64, reset, retryAfter time.Duration, ok bool) {
	allowed, remaining, reset, retryAfter, _, ok = ref.SpendFrom(cost, now)
	return allowed, remaining, reset, retryAfter, ok
}

// SpendFrom is SpendAt, and reports where the tokens came from, for a
// caller that may refund them (Leases.Refund).
func (ref Ref) SpendFrom(cost float64, now int64) (allowed bool, remaining float64, reset, retryAfter time.Duration, src Source, ok bool) {
	q := ref.q
	if q == nil || !q.answered() {
		return false, 0, 0, 0, Source{}, false
	}
	q.mu.Lock()
	if !q.h.Valid(now) {
		q.mu.Unlock()
		return false, 0, 0, 0, Source{}, false
	}
	q.count(cost, now)
	allowed, flag := q.spendValid(cost, now)
	remaining = q.h.Balance
	reset, retryAfter = waits(&q.h, allowed, cost)
	src = q.ownSource()
	q.mu.Unlock()
	if flag {
		ref.l.flag(q) // as Leases.Spend does
	}
	return allowed, remaining, reset, retryAfter, src, true
}

// count records cost as asked for at now, admitted or not; q.mu held.
func (q *quota) count(cost float64, now int64) {
	q.requested += cost
	q.sinceReport += cost
	q.lastUsed = now
}

// waitFirst waits, if q's first answer has not arrived, until it does or
// its cold start ends (or limit passes, or ctx is done), and returns the
// time then.
func (l *Leases) waitFirst(ctx context.Context, q *quota, now, limit int64) int64 {
	if q.answered() {
		return now
	}
	// Every decision of a new quota waits for its grant, not only the
	// one that added it: a second caller of the same new subject would
	// otherwise fall to the failure policy.
	q.mu.Lock()
	until, ready := min(q.coldUntil, limit), q.ready
	q.mu.Unlock()
	if wait := time.Duration(until-l.Now()) * time.Microsecond; wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-ready:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	return l.Now()
}

// spendOwn spends cost from q's own lease at now; q.mu held. flag is true
// when the slice just ran dry (the caller flags q once q.mu is released).
func (l *Leases) spendOwn(q *quota, cost float64, now int64) (res bucket.Result, ok, flag bool) {
	if !q.h.Valid(now) {
		return bucket.Result{}, false, false
	}
	allowed, flag := q.spendValid(cost, now)
	return result(&q.h, allowed, cost), true, flag
}

// spendValid spends cost from q's own lease, valid at now; q.mu held. flag
// as spendOwn's.
func (q *quota) spendValid(cost float64, now int64) (allowed, flag bool) {
	allowed = q.h.Spend(now, cost)
	if !allowed && !q.dry {
		q.dry, flag = true, true
	}
	return allowed, flag
}

// result is a decision's answer from the holding it was taken from.
func result(h *lease.Holding, allowed bool, cost float64) bucket.Result {
	res := bucket.Result{Allowed: allowed, Remaining: h.Balance}
	res.Reset, res.RetryAfter = waits(h, allowed, cost)
	return res
}

// waits is how long until h is full again, and (denied) until cost fits:
// 0 when h does not refill.
func waits(h *lease.Holding, allowed bool, cost float64) (reset, retryAfter time.Duration) {
	bal, rate := h.Balance, h.Lease.Rate
	if rate > 0 {
		reset = micros((h.Lease.Cap - bal) / rate)
		if !allowed {
			retryAfter = micros((cost - bal) / rate)
		}
	}
	return reset, retryAfter
}

// Prepare starts acquiring the lease of (rule, subject) if this agent has
// not asked for it yet, without waiting. A request that decides several
// leased subjects prepares them all before its first Take: their first
// grants then share requests, and their decisions wait out one cold start
// together instead of one after another.
func (l *Leases) Prepare(r *rules.Rule, subject string) {
	if r.Lease.DefaultShare > 0 && subject != "" {
		// Its decisions wait for the rule's default lease, if for anything
		// (and DefaultSubject's are refused by Spend).
		if l.lookup(r.Name, rules.DefaultSubject) == nil {
			l.addDefault(r)
		}
		return
	}
	if l.lookup(r.Name, subject) == nil {
		l.add(r.Name, subject, r.Rate, true)
	}
}

// Share reports the sizes of the lease this agent holds for (rule,
// subject) now: its cap and rate, and whether it is valid.
func (l *Leases) Share(rule, subject string) (capacity, rate float64, valid bool) {
	q := l.lookup(rule, subject)
	if q == nil {
		return 0, 0, false
	}
	now := l.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.h.Lease.Cap, q.h.Lease.Rate, q.h.Valid(now)
}

// Refund gives back tokens a denied multi-rule request took from src (a
// Spend's); they return to the local bucket they came from (never above
// its cap), never to the coordinator. They land only while that bucket
// still holds the lease they were spent from: once it was dropped,
// released or let go and another granted (or the copy forgotten and
// cloned again), the new lease's tokens are the coordinator's count
// alone, and a refund into it would add tokens it never gave; the refund
// is dropped (under-admission, never over).
func (l *Leases) Refund(src Source, cost float64) {
	q := src.q
	if q == nil || !(cost > 0) {
		return
	}
	now := l.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	h := &q.h
	if src.cp != nil {
		h = q.cp // nil once forgotten: the tokens are lost, never doubled
		if h != src.cp {
			return
		}
	}
	if h != nil && h.Lease.ID == src.id && h.Valid(now) {
		h.Balance = min(h.Lease.Cap, h.Available(now)+cost)
	}
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

func micros(sec float64) time.Duration {
	if !(sec > 0) {
		return 0
	}
	// math.Ceil is a call; on this hot path the comparison is cheaper.
	// Past maxMicros the conversion would overflow: the longest duration.
	us := sec * 1e6
	if us >= maxMicros {
		return math.MaxInt64
	}
	n := int64(us)
	if float64(n) < us {
		n++
	}
	return time.Duration(n) * time.Microsecond
}

// maxMicros is the most microseconds a time.Duration holds, as a float.
const maxMicros = float64(math.MaxInt64 / int64(time.Microsecond))

func (l *Leases) lookup(rule, subject string) *quota {
	byRule := (*l.quotas.Load())[rule]
	if byRule == nil {
		return nil
	}
	if q, ok := byRule.Load(subject); ok {
		return q.(*quota)
	}
	return nil
}

func (l *Leases) add(rule, subject string, rate float64, own bool) *quota {
	return l.addQuota(rule, subject, rate, own, nil)
}

// addQuota adds (rule, subject) unless it exists, and returns the quota.
// own: ask for its lease at once. init, if set, finishes a new quota
// before anyone can see it.
func (l *Leases) addQuota(rule, subject string, rate float64, own bool, init func(*quota)) *quota {
	l.mu.Lock()
	defer l.mu.Unlock()
	cur := *l.quotas.Load()
	byRule := cur[rule]
	if byRule == nil {
		next := make(map[string]*sync.Map, len(cur)+1)
		for k, v := range cur {
			next[k] = v
		}
		byRule = &sync.Map{}
		next[rule] = byRule
		l.quotas.Store(&next)
	}
	if q, ok := byRule.Load(subject); ok {
		return q.(*quota)
	}
	id := rule + "|" + subject
	now := l.Now()
	q := &quota{rule: rule, subject: subject, id: id, rate: rate, ready: make(chan struct{}), lastUsed: now, reportedAt: now, sampledAt: now, created: now,
		coldUntil: now + l.o.ColdStart.Microseconds(), own: own}
	q.h = lease.Holding{Quota: id, Validity: l.validity}
	if init != nil {
		init(q)
	}
	if len(id) > lease.MaxNameLen {
		// The coordinator would refuse it: never ask (the agent's request
		// checks normally stop such a subject before it gets here).
		q.invalid, q.failed = true, fmt.Sprintf("%s: quota %q is %d bytes, at most %d", itemErrInvalid, id[:32]+"...", len(id), lease.MaxNameLen)
		q.markReady()
	} else if own {
		l.fresh = append(l.fresh, q)
		l.kick()
	}
	byRule.Store(subject, q)
	l.count++
	l.m.quotas.Set(float64(l.count))
	return q
}

// flag queues q for the loop's next look at early renewals.
func (l *Leases) flag(q *quota) {
	l.mu.Lock()
	l.early = append(l.early, q)
	l.mu.Unlock()
	l.kick()
}

func (l *Leases) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Nudge is a leader's nudge arriving as the Watch stream delivers it: the
// quotas named are renewed at once, by the next Round. For drivers of
// Round (the simulator); Run's own stream calls it.
func (l *Leases) Nudge(refs []*rationv1.QuotaRef) { l.nudge(refs) }

// nudge marks the quotas the leader asked to renew at once.
func (l *Leases) nudge(refs []*rationv1.QuotaRef) {
	n := 0
	for _, r := range refs {
		q := l.lookup(r.GetRule(), r.GetSubject())
		if q == nil {
			continue
		}
		q.mu.Lock()
		q.nudged = true
		q.mu.Unlock()
		l.flag(q)
		n++
	}
	l.m.nudges.Add(float64(n))
}

func (l *Leases) takeFresh() []*quota {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.fresh
	l.fresh = nil
	return f
}

func (l *Leases) takeEarly() []*quota {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.early
	l.early = nil
	return e
}

func (l *Leases) snapshot() []*quota {
	l.mu.Lock()
	n := l.count
	l.mu.Unlock()
	out := make([]*quota, 0, n+8)
	for _, m := range *l.quotas.Load() {
		m.Range(func(_, v any) bool {
			out = append(out, v.(*quota))
			return true
		})
	}
	if l.o.SortedScans {
		slices.SortFunc(out, func(a, b *quota) int { return strings.Compare(a.id, b.id) })
	}
	return out
}

// remove forgets idle quotas; a decision racing with it may still spend the
// removed quota's (released, so invalid) holding and falls to its policy
// once, then re-acquires.
func (l *Leases) remove(qs []*quota) {
	// Copies of a default lease first (their quota's lock is taken after
	// the default quota's, and neither under l.mu): a copy spent since the
	// loop looked stays, with its quota.
	now := l.Now()
	keep := qs[:0:0]
	for _, q := range qs {
		if d := q.def; d != nil {
			d.mu.Lock()
			q.mu.Lock()
			ok := q.evictable(now)
			if ok {
				delete(d.copies, q)
				q.cp, q.removed = nil, true
			}
			q.mu.Unlock()
			d.mu.Unlock()
			if !ok {
				continue
			}
		} else if q.isDefault {
			q.mu.Lock()
			ok := len(q.copies) == 0
			q.removed = ok
			q.mu.Unlock()
			if !ok {
				continue
			}
		}
		keep = append(keep, q)
	}
	qs = keep
	l.mu.Lock()
	defer l.mu.Unlock()
	cur := *l.quotas.Load()
	for _, q := range qs {
		if m := cur[q.rule]; m != nil && m.CompareAndDelete(q.subject, q) {
			l.count--
		}
	}
	l.m.quotas.Set(float64(l.count))
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
	t := time.NewTicker(l.o.Tick)
	defer t.Stop()
	for {
		l.stepped.Store(time.Now().UnixNano())
		select {
		case <-ctx.Done():
			rctx, cancel := l.callCtx(context.WithoutCancel(ctx))
			l.release(rctx, l.snapshot())
			cancel()
			return
		case <-t.C:
		case <-l.wake:
		}
		l.round(ctx)
	}
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
// least every Tick, or every RequestTimeout while a call is out.
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
// scan. Run need not ask: it looks at every tick.
func (l *Leases) Due() int64 {
	l.mu.Lock()
	waiting := len(l.fresh)+len(l.early) > 0
	l.mu.Unlock()
	if waiting {
		return l.retryAt
	}
	return max(l.nextScan, l.retryAt)
}

// pick is what one look found to send.
type pick struct {
	grants, renews []*quota
	idle           []*quota
	// demote: subjects whose copy of the default lease has paid for every
	// decision for IdleAfter: their own leases go back.
	demote []*quota
}

// look sorts qs at now into new quotas (grants), quotas due at their renew
// point, quotas that may renew early, and idle ones. When anything is at
// its renew point, every other quota looked at renews with it: one renewal
// per agent per period, not per quota. It returns the earliest time a
// quota it left alone wants looking at again (at most next).
func (l *Leases) look(qs []*quota, full bool, now, next int64) (pick, int64) {
	var p pick
	var rest []*quota
	anyDue := false
	// Fresh and flagged quotas may repeat (a quota flagged twice); a full
	// scan's snapshot holds each once and may hold 100,000 of them, so it
	// skips the set.
	var seen map[*quota]bool
	if !full {
		seen = make(map[*quota]bool, len(qs))
	}
	for _, q := range qs {
		if seen != nil {
			if seen[q] {
				continue
			}
			seen[q] = true
		}
		q.mu.Lock()
		idle := now-max(q.lastUsed, q.touched.Load()) > l.o.IdleAfter.Microseconds()
		if idle && q.isDefault && len(q.copies) > 0 {
			// Its subjects' copies still mirror it: it goes after them
			// (once full again), and is renewed like a lease in use
			// meanwhile, or it would lapse and take their balances (and
			// the debts that keep them) with it.
			idle = false
		}
		switch {
		case idle && q.evictable(now):
			p.idle = append(p.idle, q)
		case !q.own:
			// A subject spending only its copy of the default lease:
			// nothing to ask the coordinator.
		case q.def != nil && !q.invalid && q.h.Lease.ID != 0 && now-q.ownUsed > l.o.IdleAfter.Microseconds():
			p.demote = append(p.demote, q)
		case q.invalid:
		case q.failed != "" && now-q.failedAt < failedRetry.Microseconds():
			// The coordinator refused this quota; ask again later in case
			// its rules change.
			next = min(next, q.failedAt+failedRetry.Microseconds())
		case q.h.Lease.ID == 0:
			p.grants = append(p.grants, q)
		default:
			q.sample(now)
			if q.dry && !(q.demandAt(now) > q.h.Lease.Rate) {
				q.dry = false // a burst, not a demand above the share
			}
			renewAt := l.renewAt(q)
			// A demand that fell to half of what was reported is worth
			// telling at once: another holder may want what this one no
			// longer does (a rise shows up as a dry slice instead).
			fell := q.fell(now)
			// A shrink is confirmed at once; a nudge or a fallen demand
			// at most every EarlyGap; a dry slice asks with a backoff of
			// its own (dryAt), so that asking in vain never delays the
			// others.
			var at int64 = math.MaxInt64
			if q.confirm {
				at = now
			}
			if q.nudged || fell {
				at = min(at, q.sentAt+l.o.EarlyGap.Microseconds())
			}
			if q.dry {
				at = min(at, q.dryAt)
			}
			switch {
			case now >= renewAt:
				anyDue = true
				p.renews = append(p.renews, q)
			case now >= at:
				p.renews = append(p.renews, q)
			default:
				rest = append(rest, q)
				next = min(next, renewAt, at)
			}
		}
		q.mu.Unlock()
	}
	if anyDue {
		p.renews = append(p.renews, rest...)
	}
	return p, next
}

// rescan is the time between two scans of every quota: rescan, and longer
// (up to a second) for an agent with more than 10,000 quotas, so that the
// scans cost about the same per second whatever the count.
func (l *Leases) rescan() time.Duration {
	l.mu.Lock()
	n := l.count
	l.mu.Unlock()
	return min(time.Second, rescan*time.Duration(max(1, n/10000)))
}

// renewAt is the renew point of the validity of q's last answer; q.mu held.
func (l *Leases) renewAt(q *quota) int64 {
	return q.h.ValidUntil - int64(float64(l.validity(q.h.Lease.Term))*(1-l.o.RenewAt))
}

// round renews what is due, split into requests within MaxItems and
// MaxRequestBytes, sent one after another (a holder's sequence numbers
// must reach the leader in order); quotas that appear meanwhile are
// granted in the next request of the round, not after it. It scans every
// quota only at nextScan; otherwise it looks at new and flagged ones.
func (l *Leases) round(ctx context.Context) {
	now := l.Now()
	if now < l.retryAt {
		return
	}
	fresh, early := l.takeFresh(), l.takeEarly()
	var p pick
	if now >= l.nextScan {
		p, l.nextScan = l.look(l.snapshot(), true, now, now+l.rescan().Microseconds())
	} else {
		var next int64
		p, next = l.look(append(fresh, early...), false, now, l.nextScan)
		if next < l.nextScan {
			l.nextScan = next
		}
	}
	if len(p.idle) > 0 {
		rctx, cancel := l.callCtx(ctx)
		l.release(rctx, p.idle)
		cancel()
		l.remove(p.idle)
	}
	if len(p.demote) > 0 {
		l.demote(ctx, p.demote, now)
	}
	queued := make(map[*quota]bool, len(p.grants)+len(p.renews))
	for _, q := range p.grants {
		queued[q] = true
	}
	for _, q := range p.renews {
		queued[q] = true
	}
	grants, renews := p.grants, p.renews
	for len(grants)+len(renews) > 0 {
		var added []*quota
		for _, q := range l.takeFresh() {
			if !queued[q] {
				queued[q] = true
				added = append(added, q)
			}
		}
		if len(added) > 0 {
			// Ahead of the rest in one copy: prepending them one at a
			// time is quadratic, and a burst of 100,000 new subjects
			// stalled the loop (no request sent for the whole burst).
			grants = append(added, grants...)
		}
		var g, r []*quota
		g, r, grants, renews = l.split(grants, renews)
		ok, finer := l.send(ctx, g, r)
		if finer {
			// Refused as too large: the same quotas again, in smaller
			// requests, at once.
			grants, renews = append(g, grants...), append(r, renews...)
			continue
		}
		if !ok {
			// Back off; everything is looked at again then.
			for _, q := range grants {
				q.markReady()
			}
			l.nextScan = l.retryAt
			return
		}
	}
}

// demote gives back the own leases of subjects whose copies of the default
// lease have paid for all their decisions for IdleAfter: the subject goes
// back to its copy alone, and asks for its own lease again when the copy
// next runs dry (a new grant, waited for like any first one). A subject
// that needed its own lease again meanwhile keeps asking: its released
// lease is renewed, refused as expired, and granted afresh.
func (l *Leases) demote(ctx context.Context, qs []*quota, now int64) {
	rctx, cancel := l.callCtx(ctx)
	l.release(rctx, qs)
	cancel()
	n := 0
	for _, q := range qs {
		q.mu.Lock()
		if now-q.ownUsed > l.o.IdleAfter.Microseconds() {
			n++
			q.own = false
			q.h = lease.Holding{Quota: q.id, Validity: l.validity}
			q.nudged, q.confirm, q.dry, q.failed = false, false, false, ""
			// Its next first decision waits for the next grant.
			q.ready, q.readyOnce = make(chan struct{}), sync.Once{}
			q.got.Store(false)
		}
		q.mu.Unlock()
	}
	l.m.demoted.Add(float64(n))
}

// split takes the next request's quotas: grants first, then renewals, up
// to MaxItems items and about MaxRequestBytes.
func (l *Leases) split(grants, renews []*quota) (g, r, restG, restR []*quota) {
	n, size := 0, 64
	fits := func(q *quota) bool {
		sz := itemBytes + len(q.rule) + len(q.subject)
		if n > 0 && (n >= l.maxItems || size+sz > l.o.MaxRequestBytes) {
			return false
		}
		n, size = n+1, size+sz
		return true
	}
	i := 0
	for i < len(grants) && fits(grants[i]) {
		i++
	}
	g, restG = grants[:i], grants[i:]
	j := 0
	if len(restG) == 0 {
		for j < len(renews) && fits(renews[j]) {
			j++
		}
	}
	return g, renews[:j], restG, renews[j:]
}

// send sends one Renew for grants and renews and adopts its answers. It
// reports false when the request failed (the caller backs off), and finer
// when the coordinator refused it whole while it had several items (the
// caller sends them again in smaller requests).
func (l *Leases) send(ctx context.Context, grants, renews []*quota) (ok, finer bool) {
	now := l.Now()
	// New grants first: the coordinator gives them seq, seq+1, ... in item
	// order and the renewals the next number.
	req := &rationv1.RenewRequest{Holder: l.name, Region: l.o.Region, Seq: l.seq}
	seqs := make([]uint64, 0, len(grants)+len(renews))
	for i, q := range grants {
		seq := l.seq + uint64(i)
		q.mu.Lock()
		// A new lease asks for at least the whole rate: a demand measured
		// before the key existed says nothing, and the coordinator gives a
		// lone holder all of it anyway.
		demand := max(q.report(now)-q.copyRate(), q.rate)
		q.h.Grant(now, l.name, seq, demand)
		if q.isDefault {
			q.mirror(func(c *lease.Holding) { c.Grant(now, l.name, seq, demand) })
		}
		q.nudged, q.confirm = false, false
		q.mu.Unlock()
		seqs = append(seqs, seq)
		req.Items = append(req.Items, &rationv1.RenewItem{
			Quota: &rationv1.QuotaRef{Rule: q.rule, Subject: q.subject}, Demand: demand,
		})
	}
	renewSeq := l.seq + uint64(len(grants))
	for _, q := range renews {
		q.mu.Lock()
		dryAsk := q.dry && !q.nudged && !q.confirm
		q.sentNudged = q.nudged
		demand := max(0, q.report(now)-q.copyRate())
		it := q.h.Renewal(now, renewSeq, demand, 0)
		if q.isDefault {
			// Give back only what every copy gives back.
			q.mirror(func(c *lease.Holding) {
				it.Unused = min(it.Unused, c.Renewal(now, renewSeq, demand, 0).Unused)
			})
		}
		q.dryAsk = dryAsk
		q.nudged, q.confirm, q.dry = false, false, false
		q.sentAt = now
		q.dryAt = now + max(q.dryGap, l.o.EarlyGap.Microseconds())
		q.mu.Unlock()
		seqs = append(seqs, renewSeq)
		req.Items = append(req.Items, &rationv1.RenewItem{
			Quota: &rationv1.QuotaRef{Rule: q.rule, Subject: q.subject}, LeaseId: it.LeaseID,
			Unused: it.Unused, Demand: it.Demand, ConfirmedCap: it.ConfirmedCap, ConfirmedRate: it.ConfirmedRate,
		})
	}
	if len(req.Items) == 0 {
		return true, false
	}
	l.seq = renewSeq + 1

	if l.o.Logger.Enabled(ctx, slog.LevelDebug) {
		for _, it := range req.Items {
			l.o.Logger.Debug("lease renewal", "rule", it.Quota.GetRule(), "lease_id", it.LeaseId, "demand", it.Demand, "unused", it.Unused)
		}
	}
	// The holder's clock times the call: one reading fewer than time.Now
	// and time.Since, and the answer's receive time (recv) besides.
	start := l.Now()
	rctx, cancel := l.callCtx(ctx)
	resp, err := l.o.Client.Renew(rctx, req)
	cancel()
	recv := l.Now()
	l.m.renewDuration.Observe(float64(recv-start) / 1e6)
	if err != nil || len(resp.GetGrants()) != len(req.Items) {
		if err == nil {
			err = fmt.Errorf("coordinator answered %d grants for %d items", len(resp.GetGrants()), len(req.Items))
		}
		l.m.renewed("error").Inc()
		if status.Code(err) == codes.InvalidArgument && len(req.Items) > 1 {
			// Refused whole: most likely more items than this coordinator
			// takes (its -max-items is below ours). Split finer.
			l.maxItems = max(1, len(req.Items)/2)
			l.o.Logger.Warn("coordinator refused a lease request; splitting requests finer", "items", len(req.Items), "max_items", l.maxItems, "err", err)
			return false, true
		}
		l.backoff = min(max(2*l.backoff, l.o.Tick), maxBackoff)
		l.retryAt = l.Now() + l.backoff.Microseconds()
		if l.down.CompareAndSwap(0, time.Now().UnixNano()) {
			l.o.Logger.Warn("lease renewal failing: leases are spent until they expire, then failure policies apply", "err", err)
		}
		// The cold-start waiters learn there is nothing to wait for.
		for _, q := range grants {
			q.markReady()
		}
		return false, false
	}
	l.m.renewed("ok").Inc()
	l.backoff, l.retryAt = 0, 0
	if d := l.down.Swap(0); d != 0 {
		l.o.Logger.Info("lease renewals succeeding again", "failed_for", time.Since(time.Unix(0, d)).Round(time.Millisecond))
	}
	for i, q := range append(grants, renews...) {
		l.adopt(q, seqs[i], resp.Grants[i], recv)
		q.mu.Lock()
		if q.h.Lease.ID != 0 {
			l.nextScan = min(l.nextScan, l.renewAt(q))
		}
		q.mu.Unlock()
	}
	return true, false
}

// drop forgets q's lease (and, for a default quota, every copy's); q.mu
// held.
func (q *quota) drop() {
	q.h.Drop()
	if q.isDefault {
		q.mirror((*lease.Holding).Drop)
	}
}

// copyRate is what q's copy of its rule's default lease refills per
// second, 0 without one; q.mu held. A subject's own lease is asked for
// the demand beyond it.
func (q *quota) copyRate() float64 {
	if q.cp == nil {
		return 0
	}
	return q.cp.Lease.Rate
}

func (l *Leases) adopt(q *quota, seq uint64, g *rationv1.Grant, now int64) {
	defer q.markReady()
	q.mu.Lock()
	defer q.mu.Unlock()
	switch e := g.GetError(); {
	case e == "":
		q.failed = ""
		oldCap, oldRate := q.h.Lease.Cap, q.h.Lease.Rate
		nl := lease.Lease{ID: g.LeaseId, Quota: q.id, Balance: g.Balance, Cap: g.Cap, Rate: g.Rate, Term: g.DurationUs}
		if !q.h.Adopt(now, seq, nl) {
			return
		}
		if q.isDefault {
			q.mirror(func(c *lease.Holding) { c.Adopt(now, seq, nl) })
		}
		l.m.granted.Add(g.Balance)
		shrunk := q.h.Lease.Cap < oldCap || q.h.Lease.Rate < oldRate || q.h.Owed > 0
		big := q.h.Lease.Cap < (1-confirmShrink)*oldCap || q.h.Lease.Rate < (1-confirmShrink)*oldRate || q.h.Owed > confirmShrink*q.h.Lease.Cap
		if shrunk && (big || q.sentNudged) {
			// A shrink is counted at the old size until confirmed: confirm
			// it at once (giving back the excess) so the rate it frees
			// reaches whoever wants it in a round trip: when the leader
			// asked for it (a nudge: someone is below its share), or when
			// it frees enough to matter. A small shrink the holder was not
			// asked for is confirmed at its next renewal: shares move by a
			// few percent with every noisy demand report, and confirming
			// each of them at once made every renewal answer trigger
			// another request (the simulator, internal/sim, measured 3x
			// the requests under contention).
			q.confirm = true
			l.mu.Lock()
			l.early = append(l.early, q)
			l.mu.Unlock()
			l.kick()
		}
		switch {
		case q.h.Lease.Rate > oldRate*dryHelped || q.h.Lease.Cap > oldCap*dryHelped:
			// Asking helped: ask again as soon as needed. Only a real gain
			// counts: a contended quota's share wanders by a few percent
			// with the holders' demand reports, and resetting on that kept
			// every holder of it asking every EarlyGap.
			q.dryGap = 0
		case q.dryAsk:
			// Asking brought nothing (the quota is contended and this is
			// the fair share): ask less often, down to the renew point;
			// the leader nudges when something frees up.
			q.dryGap = min(2*max(q.dryGap, l.o.EarlyGap.Microseconds()), l.validity(q.h.Lease.Term)/2)
		}
		q.dryAt = q.sentAt + max(q.dryGap, l.o.EarlyGap.Microseconds())
	case strings.HasPrefix(e, itemErrLeaseExpired), strings.HasPrefix(e, itemErrRetryGrant):
		q.drop()
		l.m.expired.Inc()
	case strings.HasPrefix(e, itemErrInvalid):
		// Refused alone, and would be again: stop asking for it; its
		// decisions take the rule's failure policy.
		q.drop()
		q.invalid = true
		q.failed, q.failedAt = e, now
		l.o.Logger.Error("coordinator refused a leased quota as invalid: its failure policy applies", "rule", q.rule, "err", e)
	default:
		// Unknown quota, too many subjects, or an error this build does not
		// know: the quota's decisions take the failure policy; ask again
		// after failedRetry in case the coordinator's rules change.
		q.drop()
		if q.failed == "" {
			l.o.Logger.Error("coordinator refused a leased quota: its failure policy applies", "rule", q.rule, "err", e)
		}
		q.failed, q.failedAt = e, now
	}
}

// release returns the balance of qs and stops spending them, in requests
// within MaxItems.
func (l *Leases) release(ctx context.Context, qs []*quota) {
	for len(qs) > 0 {
		k := min(len(qs), l.o.MaxItems)
		l.releaseOnce(ctx, qs[:k])
		qs = qs[k:]
	}
}

func (l *Leases) releaseOnce(ctx context.Context, qs []*quota) {
	req := &rationv1.ReleaseRequest{Holder: l.name, Seq: l.seq}
	now := l.Now()
	for _, q := range qs {
		q.mu.Lock()
		if q.h.Lease.ID == 0 {
			q.mu.Unlock()
			continue
		}
		seq := req.Seq + uint64(len(req.Items))
		rel := q.h.Release(now, l.name, seq)
		if q.isDefault {
			q.mirror(func(c *lease.Holding) { rel.Unused = min(rel.Unused, c.Release(now, l.name, seq).Unused) })
		}
		q.mu.Unlock()
		req.Items = append(req.Items, &rationv1.RenewItem{
			Quota: &rationv1.QuotaRef{Rule: q.rule, Subject: q.subject}, LeaseId: rel.LeaseID, Unused: rel.Unused,
		})
		l.m.returned.Add(rel.Unused)
	}
	if len(req.Items) == 0 {
		return
	}
	l.seq += uint64(len(req.Items))
	if _, err := l.o.Client.Release(ctx, req); err != nil {
		// The tokens are forfeit, not double-spent: Release stopped the
		// local spending before the call.
		l.o.Logger.Warn("lease release failed; unused tokens are lost until the leases expire", "err", err, "leases", len(req.Items))
	}
}
