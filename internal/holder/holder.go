package holder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
)

// Client is what the holder needs of the coordinators (coordinator.Client).
type Client interface {
	Renew(ctx context.Context, req *rationv1.RenewRequest) (*rationv1.RenewResponse, error)
	Release(ctx context.Context, req *rationv1.ReleaseRequest) (*rationv1.ReleaseResponse, error)
}

const (
	// failedRetry spaces out asking again for a quota the coordinator did
	// not know.
	failedRetry = 10 * time.Second
	// maxBackoff caps the pause between failed Renew rounds. Leases live for
	// seconds, so a longer pause would let them lapse needlessly.
	maxBackoff = time.Second
)

// Options tune a Leases.
type Options struct {
	Client Client
	// Holder is this agent's id, unique per agent process.
	Holder string
	Region string
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
	// RequestTimeout bounds one Renew or Release call (default 2s).
	RequestTimeout time.Duration
	// IdleAfter releases a quota unused for this long (default 1m).
	IdleAfter time.Duration
	// Tick is the renewal loop's resolution (default 20ms).
	Tick     time.Duration
	Logger   *slog.Logger
	Registry prometheus.Registerer
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
	requested float64 // tokens asked for since the last report (admitted or not)
	lastUsed  int64
	failed    string // an item error (unknown quota), logged once
	failedAt  int64
	ready     chan struct{} // closed once the first answer (grant or error) arrived
	readyOnce sync.Once
}

func (q *quota) markReady() { q.readyOnce.Do(func() { close(q.ready) }) }

// Leases is the agent's set of leases. It implements agent.Leases.
type Leases struct {
	o     Options
	start time.Time // monotonic origin of Now
	m     *metrics

	// quotas maps rule -> *sync.Map(subject -> *quota). The outer map is
	// copied on write (rules are few and change rarely); decisions read it
	// and the inner map without locks.
	mu     sync.Mutex
	quotas atomic.Pointer[map[string]*sync.Map]
	count  int

	wake chan struct{}
	seq  uint64 // next sequence number; only the loop touches it
	// retryAt delays the next round after a failed Renew (backoff), on Now.
	retryAt int64
	backoff time.Duration

	// down is when renewals started failing (unix nanos), 0 while healthy.
	down atomic.Int64
}

// New builds a Leases; call Run to start renewing.
func New(o Options) (*Leases, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	l := &Leases{
		o:     o,
		start: time.Now(),
		wake:  make(chan struct{}, 1),
		// Sequence numbers must grow across restarts of the same holder id;
		// the wall clock in microseconds does that without any storage.
		seq: uint64(time.Now().UnixMicro()),
	}
	l.m = newMetrics(o.Registry)
	l.quotas.Store(&map[string]*sync.Map{})
	return l, nil
}

// Now is the holder's monotonic clock in microseconds. Callers read it once
// per batch of decisions and pass it to Take.
func (l *Leases) Now() int64 { return int64(time.Since(l.start) / time.Microsecond) }

// validity turns a lease term into how long after sending the holder may
// spend it.
func (l *Leases) validity(term int64) int64 {
	return lease.AgentValidity(term, l.o.Drift, l.o.Pause.Microseconds())
}

// Take spends cost from the lease of (rule, subject) at now (from Now). ok
// is false when there is no valid lease: the caller applies the rule's
// failure policy. The first call for a quota waits up to ColdStart for its
// first grant; no other call does any I/O or waits.
func (l *Leases) Take(ctx context.Context, r *rules.Rule, subject string, cost float64, now int64) (res bucket.Result, ok bool) {
	q := l.lookup(r.Name, subject)
	if q == nil {
		q = l.add(r.Name, subject, r.Rate)
		l.kick()
		t := time.NewTimer(l.o.ColdStart)
		select {
		case <-q.ready:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		now = l.Now()
	}
	q.mu.Lock()
	q.requested += cost
	q.lastUsed = now
	if !q.h.Valid(now) {
		q.mu.Unlock()
		return bucket.Result{}, false
	}
	allowed := q.h.Spend(now, cost)
	bal, rate, capa := q.h.Balance, q.h.Lease.Rate, q.h.Lease.Cap
	q.mu.Unlock()

	res = bucket.Result{Allowed: allowed, Remaining: bal}
	if rate > 0 {
		res.Reset = micros((capa - bal) / rate)
		if !allowed {
			res.RetryAfter = micros((cost - bal) / rate)
		}
	}
	return res, true
}

// Refund gives back tokens a denied multi-rule request took; they return
// to the local bucket (never above its cap), never to the coordinator.
func (l *Leases) Refund(r *rules.Rule, subject string, cost float64) {
	q := l.lookup(r.Name, subject)
	if q == nil {
		return
	}
	now := l.Now()
	q.mu.Lock()
	if q.h.Valid(now) {
		q.h.Balance = min(q.h.Lease.Cap, q.h.Balance+cost)
	}
	q.mu.Unlock()
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
	return time.Duration(math.Ceil(sec*1e6)) * time.Microsecond
}

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

func (l *Leases) add(rule, subject string, rate float64) *quota {
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
	q := &quota{rule: rule, subject: subject, id: id, rate: rate, ready: make(chan struct{}), lastUsed: l.Now()}
	q.h = lease.Holding{Quota: id, Validity: l.validity}
	byRule.Store(subject, q)
	l.count++
	l.m.quotas.Set(float64(l.count))
	return q
}

func (l *Leases) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *Leases) snapshot() []*quota {
	out := make([]*quota, 0, 8)
	for _, m := range *l.quotas.Load() {
		m.Range(func(_, v any) bool {
			out = append(out, v.(*quota))
			return true
		})
	}
	return out
}

// remove forgets idle quotas; a decision racing with it may still spend the
// removed quota's (released, so invalid) holding and falls to its policy
// once, then re-acquires.
func (l *Leases) remove(qs []*quota) {
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
// RequestTimeout) so their unused budget goes back to the pool.
func (l *Leases) Run(ctx context.Context) {
	t := time.NewTicker(l.o.Tick)
	defer t.Stop()
	lastDemand := l.Now()
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.o.RequestTimeout)
			l.release(rctx, l.snapshot())
			cancel()
			return
		case <-t.C:
		case <-l.wake:
		}
		lastDemand = l.round(ctx, lastDemand)
	}
}

// round renews everything that is due, in one Renew, if anything is.
func (l *Leases) round(ctx context.Context, lastDemand int64) int64 {
	now := l.Now()
	all := l.snapshot()
	var due, idle []*quota
	anyDue := false
	for _, q := range all {
		q.mu.Lock()
		switch {
		case now-q.lastUsed > l.o.IdleAfter.Microseconds():
			idle = append(idle, q)
		case q.failed != "" && now-q.failedAt < failedRetry.Microseconds():
			// The coordinator's rules lack this quota; ask again later in
			// case they gain it.
		case q.h.Lease.ID == 0:
			anyDue = true
			due = append(due, q)
		default:
			// Renew at the renew point of the validity of the last answer.
			term := q.h.Lease.Term
			renewAt := q.h.ValidUntil - int64(float64(l.validity(term))*(1-l.o.RenewAt))
			if now >= renewAt {
				anyDue = true
			}
			due = append(due, q)
		}
		q.mu.Unlock()
	}
	if len(idle) > 0 {
		rctx, cancel := context.WithTimeout(ctx, l.o.RequestTimeout)
		l.release(rctx, idle)
		cancel()
		l.remove(idle)
	}
	if !anyDue || now < l.retryAt {
		return lastDemand
	}
	// Every lease goes in the same message: one renewal per agent, not per
	// quota. New grants first: the coordinator gives them seq, seq+1, ...
	// in item order and the renewals the next number.
	elapsed := max(float64(now-lastDemand)/1e6, 1e-3)
	req := &rationv1.RenewRequest{Holder: l.o.Holder, Region: l.o.Region}
	type sent struct {
		q   *quota
		seq uint64
	}
	var grants, renews []sent
	base := l.seq
	for _, q := range due {
		if q.h.Lease.ID == 0 {
			grants = append(grants, sent{q: q})
		} else {
			renews = append(renews, sent{q: q})
		}
	}
	for i := range grants {
		s := &grants[i]
		s.seq = base + uint64(i)
		q := s.q
		q.mu.Lock()
		// A new lease has no measured demand yet (the first request is all
		// it has seen): ask for the whole rate and let max-min fairness
		// give this holder what the others leave; the next renewal reports
		// the real demand.
		demand := max(q.requested/elapsed, q.rate)
		q.requested = 0
		q.h.Grant(now, l.o.Holder, s.seq, demand)
		q.mu.Unlock()
		req.Items = append(req.Items, &rationv1.RenewItem{
			Quota: &rationv1.QuotaRef{Rule: q.rule, Subject: q.subject}, Demand: demand,
		})
	}
	renewSeq := base + uint64(len(grants))
	for i := range renews {
		s := &renews[i]
		s.seq = renewSeq
		q := s.q
		q.mu.Lock()
		demand := q.requested / elapsed
		q.requested = 0
		it := q.h.Renewal(now, renewSeq, demand, 0)
		q.mu.Unlock()
		req.Items = append(req.Items, &rationv1.RenewItem{
			Quota: &rationv1.QuotaRef{Rule: q.rule, Subject: q.subject}, LeaseId: it.LeaseID,
			Unused: it.Unused, Demand: it.Demand, ConfirmedCap: it.ConfirmedCap, ConfirmedRate: it.ConfirmedRate,
		})
	}
	req.Seq = base
	l.seq = renewSeq + 1

	rctx, cancel := context.WithTimeout(ctx, l.o.RequestTimeout)
	start := time.Now()
	resp, err := l.o.Client.Renew(rctx, req)
	cancel()
	l.m.renewDuration.Observe(time.Since(start).Seconds())
	if err != nil || len(resp.GetGrants()) != len(req.Items) {
		if err == nil {
			err = fmt.Errorf("coordinator answered %d grants for %d items", len(resp.GetGrants()), len(req.Items))
		}
		l.m.renewals.WithLabelValues("error").Inc()
		l.backoff = min(max(2*l.backoff, l.o.Tick), maxBackoff)
		l.retryAt = l.Now() + l.backoff.Microseconds()
		if l.down.CompareAndSwap(0, time.Now().UnixNano()) {
			l.o.Logger.Warn("lease renewal failing: leases are spent until they expire, then failure policies apply", "err", err)
		}
		// The cold-start waiters learn there is nothing to wait for.
		for _, s := range grants {
			s.q.markReady()
		}
		return now
	}
	l.m.renewals.WithLabelValues("ok").Inc()
	l.backoff, l.retryAt = 0, 0
	if d := l.down.Swap(0); d != 0 {
		l.o.Logger.Info("lease renewals succeeding again", "failed_for", time.Since(time.Unix(0, d)).Round(time.Millisecond))
	}
	recv := l.Now()
	all2 := append(grants, renews...)
	for i, s := range all2 {
		l.adopt(s.q, s.seq, resp.Grants[i], recv)
	}
	return now
}

func (l *Leases) adopt(q *quota, seq uint64, g *rationv1.Grant, now int64) {
	defer q.markReady()
	q.mu.Lock()
	defer q.mu.Unlock()
	switch e := g.GetError(); {
	case e == "":
		q.failed = ""
		ok := q.h.Adopt(now, seq, lease.Lease{
			ID: g.LeaseId, Quota: q.id, Balance: g.Balance, Cap: g.Cap, Rate: g.Rate, Term: g.DurationUs,
		})
		if ok {
			l.m.granted.Add(g.Balance)
		}
	case strings.HasPrefix(e, itemErrLeaseExpired), strings.HasPrefix(e, itemErrRetryGrant):
		q.h.Drop()
		l.m.expired.Inc()
	case strings.HasPrefix(e, itemErrUnknownQuota):
		q.h.Drop()
		if q.failed == "" {
			l.o.Logger.Error("coordinator does not know this leased quota: its failure policy applies", "rule", q.rule, "err", e)
		}
		q.failed, q.failedAt = e, now
	default:
		q.h.Drop()
		l.o.Logger.Warn("lease item refused", "rule", q.rule, "err", e)
	}
}

// release returns the balance of qs and stops spending them.
func (l *Leases) release(ctx context.Context, qs []*quota) {
	req := &rationv1.ReleaseRequest{Holder: l.o.Holder, Seq: l.seq}
	now := l.Now()
	for _, q := range qs {
		q.mu.Lock()
		if q.h.Lease.ID == 0 {
			q.mu.Unlock()
			continue
		}
		seq := req.Seq + uint64(len(req.Items))
		rel := q.h.Release(now, l.o.Holder, seq)
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
