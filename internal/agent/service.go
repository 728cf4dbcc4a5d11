package agent

import (
	"github.com/ration-dev/ration/internal/region"

	"context"
	"errors"
	"log/slog"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/breaker"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/rules"
)

// RuleSource yields the rules in force; Current is called once per batch and
// must be cheap (an atomic load).
type RuleSource interface {
	Current() *rules.Set
}

// StaticRules is a RuleSource that never changes.
type StaticRules struct{ Set *rules.Set }

// Current returns the set.
func (s StaticRules) Current() *rules.Set { return s.Set }

// Options are a Service's collaborators.
type Options struct {
	Rules    RuleSource
	Store    Store
	Leases   Leases // nil: leased rules always fall to their failure policy
	Registry prometheus.Registerer
	Logger   *slog.Logger
	// DecisionTimeout bounds every store call of one decision.
	DecisionTimeout time.Duration
	// FirstGrantTimeout bounds a leased quota's first decision's wait for
	// its first grant (the holder's cold start); 0: the decision timeout.
	FirstGrantTimeout time.Duration
	Breaker           breaker.Config
	// Region is where the agent runs: it picks the region's share of
	// scope: global, mode: redis rules.
	Region region.ID
	// RequestRecords bounds how many requests with a request_id the agent
	// remembers for replay on the leased and failure-policy paths (0:
	// DefaultRequestRecords; negative: none, so those paths ignore ids).
	RequestRecords int
	// RequestRecordTTL is how long one is remembered (0: the Redis
	// record's bucket.DefaultRequestIDTTL).
	RequestRecordTTL time.Duration
	// LocalDenials bounds how many buckets' store denials the agent
	// remembers to deny their further requests without a store call while
	// certain (denials.go); 0: none, every decision goes to the store.
	LocalDenials int
}

// Service decides requests. It is safe for concurrent use.
type Service struct {
	cfg      Options
	rules    RuleSource
	store    Store
	leases   Leases
	preparer leasePreparer // leases', if they have Prepare
	refs     leaseRefs     // leases', if they have Ref
	logger   *slog.Logger
	metrics  *metrics
	nodes    *storeNodes // the store's nodes: breakers, outage episodes
	fallback *fallback
	rec      *recorder      // nil unless recording (-record)
	ids      *requestRecord // nil when Options.RequestRecords < 0
	hot      *hotKeys       // promoted subjects of mode auto rules (hot.go)
	denials  *denials       // the store's recent denials; nil: off
	watch    *watchdog      // nil: decisions are not watched (Core sets it)
}

// New builds a Service. It does not contact the store; see Probe.
func New(o Options) (*Service, error) {
	var errs []error
	if o.Rules == nil || o.Rules.Current() == nil {
		errs = append(errs, errors.New("agent: no rules"))
	}
	if o.Store == nil {
		errs = append(errs, errors.New("agent: no store"))
	}
	if o.DecisionTimeout <= 0 {
		errs = append(errs, errors.New("agent: decision timeout must be positive"))
	}
	if o.Breaker == (breaker.Config{}) {
		o.Breaker = breaker.DefaultConfig()
	}
	if err := o.Breaker.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	s := &Service{cfg: o, rules: o.Rules, store: o.Store, leases: o.Leases, logger: o.Logger}
	s.preparer, _ = o.Leases.(leasePreparer)
	s.refs, _ = o.Leases.(leaseRefs)
	s.metrics = newMetrics(o.Registry)
	if wc, ok := o.Store.(warmupCounter); ok {
		o.Registry.MustRegister(newWarmupsCollector(wc))
	}
	hotClock := func() int64 { return 0 }
	if o.Leases != nil {
		hotClock = o.Leases.Now
	}
	s.hot = newHotKeys(o.Region, hotClock, s.metrics)
	s.fallback = newFallback(o.Logger, s.metrics)
	s.denials = newDenials(o.LocalDenials)
	if o.RequestRecords >= 0 {
		n, ttl := o.RequestRecords, o.RequestRecordTTL
		if n == 0 {
			n = DefaultRequestRecords
		}
		if ttl <= 0 {
			ttl = bucket.DefaultRequestIDTTL
		}
		// A duplicate waits for its first attempt at most as long as that
		// attempt can take: a store charge and a refund, each bounded by
		// the decision timeout, and a lease's first grant.
		s.ids = newRequestRecord(n, ttl, 4*o.DecisionTimeout+o.FirstGrantTimeout)
	}
	s.nodes = newStoreNodes(o.Store, o.Breaker, o.Logger, s.metrics)
	s.RulesChanged(o.Rules.Current())
	return s, nil
}

// RulesChanged updates what is derived from the rules (metrics of the
// bounds in force). Call it after a reload.
func (s *Service) RulesChanged(set *rules.Set) {
	s.metrics.forgetRules(set)
	s.metrics.overshootBound.Reset()
	for _, r := range set.Rules() {
		s.metrics.overshootBound.WithLabelValues(r.Name).Set(OvershootBound(r))
	}
	s.metrics.rulesLoaded.Set(float64(len(set.Rules())))
}

// OvershootBound is the worst case one agent can admit per bucket beyond the
// quota while the rule's store is unreachable (docs/architecture.md,
// Failure policies): 0 for fail_closed, b_e + r_e*T_e for emergency, +Inf
// for fail_open. Multiply by the number of agents for the fleet-wide bound.
func OvershootBound(r *rules.Rule) float64 {
	switch r.OnFailure {
	case rules.FailOpen:
		return math.Inf(1)
	case rules.Emergency:
		return r.Emergency.Burst + r.Emergency.Rate*r.Emergency.MaxDuration.Seconds()
	default:
		return 0
	}
}

// RunProber pings each store node while its breaker is open and closes
// it on the first answer, so recovery needs no traffic and no restart. It
// returns when ctx is done.
func (s *Service) RunProber(ctx context.Context) {
	t := time.NewTicker(s.cfg.Breaker.ProbeInterval / 4)
	defer t.Stop()
	var lastTopo time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.probe(ctx, &lastTopo)
	}
}

// Probe pings the store once within the decision timeout.
func (s *Service) Probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DecisionTimeout)
	defer cancel()
	return s.store.Ping(ctx)
}

// BreakerOpen reports whether the store, or a node of it, is known to be
// down.
func (s *Service) BreakerOpen() bool { return s.nodes.open.Load() > 0 }

// observe records metrics for a decided batch.
func (s *Service) observe(steps []step, out []Response, errs []error, d time.Duration) {
	slowest := pathNone
	// A run of steps with one counter (a batch of one hot key) adds to it
	// once.
	var run *step
	n := 0
	flush := func() {
		if n > 0 {
			s.metrics.ruleDecision(run.rule, run.path, run.allowed, run.reason).Add(float64(n))
		}
	}
	for i := range steps {
		st := &steps[i]
		if st.skip {
			continue
		}
		if st.replayed {
			s.metrics.replays.WithLabelValues(st.rule.Name).Inc()
			continue
		}
		if n > 0 && st.rule == run.rule && st.path == run.path && st.allowed == run.allowed && st.reason == run.reason {
			n++
		} else {
			flush()
			run, n = st, 1
		}
		if st.path == pathRedis || slowest == pathNone {
			slowest = st.path
		}
	}
	flush()
	for i := range out {
		if errs[i] == nil && out[i].Reason == ReasonNoRule {
			s.metrics.noRule.Inc()
		}
	}
	s.metrics.durationFor(slowest).Observe(d.Seconds())
}
