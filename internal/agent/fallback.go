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

	activated sync.Map // rule name -> struct{}: already counted this episode
	decisions atomic.Int64
}

func newFallback(logger *slog.Logger, m *metrics) *fallback {
	return &fallback{logger: logger, metrics: m, local: bucket.NewMemoryStore(nil)}
}

// failure records that the store could not decide, err saying why. The
// first failure of an episode is logged with its cause: a store that
// refuses the agent's credentials is not a store that is down, and the
// operator fixes the one in -redis, not the network.
func (f *fallback) failure(now time.Time, err error) {
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
// rule's dependency has been out.
func (f *fallback) decide(ctx context.Context, st *step, down time.Duration) {
	r := st.rule
	f.activate(r)
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
}

func (f *fallback) refund(ctx context.Context, st *step) {
	if st.reason == ReasonEmergency {
		_ = f.local.Refund(ctx, st.req)
	}
}

// activate counts and logs a rule's first fallback decision of an episode.
func (f *fallback) activate(r *rules.Rule) {
	f.decisions.Add(1)
	if _, loaded := f.activated.LoadOrStore(r.Name, struct{}{}); !loaded {
		f.metrics.fallbackActivations.WithLabelValues(r.Name, r.OnFailure.String()).Inc()
		f.logger.Warn("failure policy activated", "rule", r.Name, "policy", r.OnFailure.String())
	}
}
