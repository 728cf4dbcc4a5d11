package agent

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/rules"
)

// fallback applies a rule's failure policy when its store or lease cannot
// decide. An episode starts at the first failure after a healthy period and
// ends at the next success; emergency admission is allowed for at most the
// rule's max_duration into the episode, then the rule fails closed.
type fallback struct {
	logger  *slog.Logger
	metrics *metrics
	local   *bucket.MemoryStore // emergency buckets, per agent

	episodeStart atomic.Int64 // unix nanos; 0 = healthy

	// activated: rule name -> unix nanos of its last activation line. A
	// store rule logs once per store episode; a leased rule once a
	// minute at most (its dependency has episodes of its own, per quota).
	activated sync.Map
	decisions atomic.Int64
	// lastErr is the store's last failure (a string), the cause an
	// activation line names.
	lastErr atomic.Value
}

// leasedRelog is how often a leased rule's activation is logged again
// while it keeps falling to its policy.
const leasedRelog = time.Minute

func newFallback(logger *slog.Logger, m *metrics) *fallback {
	return &fallback{logger: logger, metrics: m, local: bucket.NewMemoryStore(nil)}
}

// failure records that the store could not decide, err saying why. The
// first failure of an episode is logged with its cause: a store that
// refuses the agent's credentials is not a store that is down, and the
// operator fixes the one in -redis, not the network.
func (f *fallback) failure(now time.Time, err error) {
	if err != nil {
		f.lastErr.Store(err.Error())
	}
	if f.episodeStart.CompareAndSwap(0, now.UnixNano()) {
		msg := "store unreachable: failure policies in force"
		if errors.Is(err, bucket.ErrAuth) {
			msg = "store refused the agent's credentials (authentication failed): failure policies in force"
		}
		f.logger.Warn(msg, "since", now, "err", err)
		f.metrics.fallbackActive.Set(1)
	}
}

// success records that the store answered; it ends an episode.
func (f *fallback) success(now time.Time) {
	if f.episodeStart.Load() == 0 {
		return
	}
	start := f.episodeStart.Swap(0)
	if start == 0 {
		return
	}
	n := f.decisions.Swap(0)
	f.activated.Clear()
	f.metrics.fallbackActive.Set(0)
	f.logger.Info("store reachable again: failure policies lifted",
		"outage", now.Sub(time.Unix(0, start)).Round(time.Millisecond), "fallback_decisions", n)
}

// since returns how long the current episode has lasted (0 when none has
// started, which happens when a leased rule has no lease yet).
func (f *fallback) since(now time.Time) time.Duration {
	start := f.episodeStart.Load()
	if start == 0 {
		return 0
	}
	return now.Sub(time.Unix(0, start))
}

// decide applies the rule's policy to one step, down being how long the
// rule's dependency has been out; leased: that dependency is the
// coordinators. It reports whether this is the rule's activation, which
// the caller logs (Service.logActivation; st is never handed to a
// function value, which would move a lone decision's steps to the heap).
func (f *fallback) decide(ctx context.Context, st *step, down time.Duration, leased bool, now time.Time) (activated bool) {
	r := st.rule
	activated = f.activate(r, leased, now)
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
func (f *fallback) activate(r *rules.Rule, leased bool, now time.Time) bool {
	f.decisions.Add(1)
	// Load first: LoadOrStore would box at (an allocation) on every
	// fallback decision of an outage, when the agent must stay cheapest.
	at := now.UnixNano()
	if v, ok := f.activated.Load(r.Name); ok {
		last := v.(int64)
		if !leased || at-last < int64(leasedRelog) || !f.activated.CompareAndSwap(r.Name, last, at) {
			return false
		}
	} else if _, loaded := f.activated.LoadOrStore(r.Name, at); loaded {
		return false // another decision activated it just now
	}
	f.metrics.fallbackActivations.WithLabelValues(r.Name, r.OnFailure.String()).Inc()
	return true
}

// logActivation logs a rule's activation of its failure policy, st being
// the step that activated it.
func (s *Service) logActivation(st *step) {
	dep, why := s.fallbackCause(st)
	s.logger.Warn("failure policy activated", "rule", st.rule.Name, "policy", st.rule.OnFailure.String(), "dependency", dep, "cause", why, "subject", truncate(st.subject))
}

// storeCause is the store's last failure, for an activation line.
func (f *fallback) storeCause() string {
	if e, _ := f.lastErr.Load().(string); e != "" {
		return e
	}
	return "no answer within -decision-timeout"
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
	if !s.breaker.Allow() {
		return "store", "circuit breaker open after consecutive failures; last: " + s.fallback.storeCause()
	}
	return "store", s.fallback.storeCause()
}
