package agent

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/rules"
)

// fallback applies a rule's failure policy when its store node or lease
// cannot decide. A store rule's episode is its node's (storeNode): it
// starts at the node's first failure after a healthy period and ends at
// its next success; emergency admission is allowed for at most the rule's
// max_duration into the episode, then the rule fails closed.
type fallback struct {
	logger  *slog.Logger
	metrics *metrics
	local   *bucket.MemoryStore // emergency buckets, per agent
	// leased: the leased rules that fell to their policy, logged at most
	// once a minute each (their dependency has episodes of its own, per
	// quota); a store rule's are its node's (storeNode.acts).
	leased activations
}

// activations are the rules that fell to their failure policy: rule name ->
// unix nanos of its last activation line.
type activations struct {
	m         sync.Map
	decisions atomic.Int64
}

// reset forgets the rules activated (an episode ended) and returns how
// many fallback decisions were made meanwhile.
func (a *activations) reset() int64 {
	n := a.decisions.Swap(0)
	a.m.Clear()
	return n
}

// leasedRelog is how often a leased rule's activation is logged again
// while it keeps falling to its policy.
const leasedRelog = time.Minute

func newFallback(logger *slog.Logger, m *metrics) *fallback {
	return &fallback{logger: logger, metrics: m, local: bucket.NewMemoryStore(nil)}
}

// decide applies the rule's policy to one step, down being how long the
// rule's dependency has been out; leased: that dependency is the
// coordinators. It reports whether this is the rule's activation, which
// the caller logs (Service.logActivation; st is never handed to a
// function value, which would move a lone decision's steps to the heap).
func (f *fallback) decide(ctx context.Context, st *step, down time.Duration, leased bool, now time.Time) (activated bool) {
	r := st.rule
	acts := &f.leased
	if !leased && st.node != nil {
		acts = &st.node.acts
	}
	activated = f.activate(acts, r, leased, now)
	switch r.OnFailure {
	case rules.FailOpen:
		st.allowed, st.reason = true, ReasonUnavailable
	case rules.Emergency:
		if down > r.Emergency.MaxDuration {
			st.allowed, st.reason = false, ReasonUnavailable
			return
		}
		st.key() // the emergency bucket is the rule's key in the local store
		req := st.req
		req.Limit = bucket.Limit{Burst: r.Emergency.Burst, Rate: r.Emergency.Rate}
		// A retry with the same id is answered from the agent's record of
		// request ids (replay.go) before it gets here; the local bucket
		// keeps no record of its own.
		req.RequestID = ""
		if req.Cost > req.Limit.Burst {
			st.allowed, st.reason = false, ReasonUnavailable
			return
		}
		res, err := f.local.Take(ctx, req)
		if err != nil {
			st.allowed, st.reason = false, ReasonUnavailable
			return
		}
		st.req, st.res, st.allowed, st.charged = req, res, res.Allowed, res.Allowed
		st.reason = ReasonEmergency
	default: // FailClosed
		st.allowed, st.reason = false, ReasonUnavailable
	}
	return activated
}

func (f *fallback) refund(ctx context.Context, st *step) {
	if st.reason == ReasonEmergency {
		_ = f.local.Refund(ctx, st.req)
	}
}

// activate counts and logs a rule's first fallback decision of an episode
// (of a leased rule: at most once a minute), naming the dependency that
// failed and its error: "failure policy activated" alone tells an
// operator nothing to fix.
func (f *fallback) activate(a *activations, r *rules.Rule, leased bool, now time.Time) bool {
	a.decisions.Add(1)
	// Load first: LoadOrStore would box at (an allocation) on every
	// fallback decision of an outage, when the agent must stay cheapest.
	at := now.UnixNano()
	if v, ok := a.m.Load(r.Name); ok {
		last := v.(int64)
		if !leased || at-last < int64(leasedRelog) || !a.m.CompareAndSwap(r.Name, last, at) {
			return false
		}
	} else if _, loaded := a.m.LoadOrStore(r.Name, at); loaded {
		return false // another decision activated it just now
	}
	f.metrics.fallbackActivations.WithLabelValues(r.Name, r.OnFailure.String()).Inc()
	return true
}

// logActivation logs a rule's activation of its failure policy, st being
// the step that activated it.
func (s *Service) logActivation(st *step) {
	dep, why := s.fallbackCause(st)
	if st.node != nil && s.nodes.router != nil && dep == "store" {
		dep = "store node " + st.node.name
	}
	s.logger.Warn("failure policy activated", "rule", st.rule.Name, "policy", st.rule.OnFailure.String(), "dependency", dep, "cause", why, "subject", truncate(st.subject))
}

// leaseCauser is the optional part of Leases that says why a spend found
// no valid lease (holder.Leases has it).
type leaseCauser interface {
	Cause(r *rules.Rule, subject string) string
}

// fallbackCause names the dependency st's rule could not be decided by,
// and why: for an activation line.
func (s *Service) fallbackCause(st *step) (dep, why string) {
	if st.rule.Mode == rules.ModeLeased || st.hot != nil {
		subject := st.subject
		if st.hot != nil && st.hot.subject != "" {
			subject = st.hot.subject
		}
		switch c, ok := s.leases.(leaseCauser); {
		case s.leases == nil:
			return "coordinators", "no lease holder: no -coordinators (or -dev without an embedded coordinator)"
		case ok:
			return "coordinators", c.Cause(st.rule, subject)
		default:
			return "coordinators", "no valid lease"
		}
	}
	n := st.node
	if n == nil {
		n = s.nodes.of(context.Background(), st.key())
	}
	if !n.br.Allow() {
		return "store", "circuit breaker open after consecutive failures; last: " + n.cause()
	}
	return "store", n.cause()
}
