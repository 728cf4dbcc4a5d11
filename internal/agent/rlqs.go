package agent

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ration-dev/ration/internal/rlqs"
	"github.com/ration-dev/ration/internal/rules"
)

// registerRLQS adds Envoy's Rate Limit Quota Service (internal/rlqs) to
// the agent's gRPC server, beside RLS v3: one rules file for both, bucket
// ids matched as RLS descriptors are (EnvoyDomainKey set to the stream's
// domain), leased rules' assignments lent out of the agent's leases, the
// other rules' taken through its decisions (rlqsTaker).
func registerRLQS(g *grpc.Server, svc *Service, cfg RLQSConfig, logger *slog.Logger, reg prometheus.Registerer) *rlqs.Server {
	// Tick: each stream's timer wakes the agent every Tick, and at the
	// package's 100ms the wake-ups of 16 streams cost the agent more CPU
	// than their reports (scripts/bench-rlqs.sh). A report settles what it
	// closes as it arrives; the timer only forfeits what no report closes
	// (after a grace of seconds) and abandons idle buckets (after a
	// minute), for which a second is resolution enough.
	o := rlqs.Options{Rules: svc.rules, Taker: rlqsTaker{svc}, Region: svc.cfg.Region,
		Logger: logger.With("component", "rlqs"), Registry: reg, Tick: time.Second,
		Delta: cfg.Delta, MaxTTL: cfg.MaxTTL, TakeTTL: cfg.TakeTTL, Grace: cfg.Grace,
		MaxStreams: cfg.MaxStreams, MaxBuckets: cfg.MaxBuckets, NoCarry: cfg.NoCarry,
		MaxClientStreams: cfg.MaxClientStreams, Silent: cfg.Silent}
	if f, ok := svc.leases.(rlqs.Funds); ok {
		o.Funds = f
	}
	s := rlqs.New(o)
	s.Register(g)
	return s
}

// rlqsTaker takes an RLQS assignment's cost from a rule RLQS does not lend
// for, as one held request of that cost on the agent's own decision path:
// the rule's store bucket (one script call), a promoted auto subject's or
// a default-share subject's lease, or the rule's failure policy (the
// emergency bucket of local_emergency, bounded per agent). The decision
// is counted, recorded and refunded as any other.
type rlqsTaker struct{ svc *Service }

func (t rlqsTaker) Take(ctx context.Context, r *rules.Rule, subject string, cost float64, spend time.Duration) (rlqs.Taken, error) {
	resp, err := t.svc.Decide(ctx, Request{Rule: r.Name, Subject: subject, Cost: cost, matched: true, heldFor: heldFor(spend)})
	if errors.Is(err, ErrUnknownRule) {
		return rlqs.Taken{Outcome: rlqs.Gone}, nil
	}
	if err != nil {
		return rlqs.Taken{}, err
	}
	tk := rlqs.Taken{Outcome: takeOutcome(resp), RetryAfter: resp.RetryAfter}
	if resp.fundFor > 0 && tk.Outcome == rlqs.Over {
		tk.Short, tk.Within = true, spendWithin(resp.fundFor)
	}
	return tk, nil
}

// spendWithin is the longest spend (real time) whose hold (heldFor) fits
// in fund µs of the leases' clock: heldFor's inverse, rounded down.
func spendWithin(fund int64) time.Duration {
	us := math.Floor(float64(fund-hotPause.Microseconds()) * (1 - hotDrift) / (1 + hotDrift))
	return time.Duration(max(0, us)) * time.Microsecond
}

// heldFor is how long a held take's cost stays held, in µs of the clock
// of the store that decides it (Redis TIME, or this host's for the local
// stores), for Envoy to spend it for up to spend of real time after the
// take starts: the store's clock may run slow by the drift bound, and
// this agent may pause between the take and the send it counts from, as
// a promotion's mark allows for.
func heldFor(spend time.Duration) int64 {
	return int64(math.Ceil(float64(spend.Microseconds())*(1+hotDrift)/(1-hotDrift))) + hotPause.Microseconds()
}

// takeOutcome is what a decision of one rule says of a take.
func takeOutcome(resp Response) rlqs.Outcome {
	switch {
	case resp.Reason == ReasonNoRule:
		// Nothing matched a request naming its rule: the rule is not in
		// force (Decide refuses an unknown name; this is for safety).
		return rlqs.Gone
	case resp.Reason == ReasonShadow:
		// The rule was reloaded as a shadow rule, which never denies: it
		// limits nothing, as RLQS treats shadow rules.
		return rlqs.Open
	case resp.Allowed && resp.Reason == ReasonUnavailable:
		return rlqs.Open // fail_open: nothing was counted
	case resp.Allowed:
		return rlqs.Funded // ReasonOK (store, lease) or ReasonEmergency
	case resp.Reason == ReasonOverLimit, resp.Reason == ReasonEmergency:
		// The quota, or the emergency bucket, lacks the cost; or (fundFor)
		// a lease cannot be spent for as long as the take is held. That
		// one is over-limit too, not unavailable: the coordinators answer,
		// and unavailable would have fail_open admit everything for want
		// of a longer validity. Denied for a short while, the bucket asks
		// again, for a TTL that fits (rlqs.Taken.Within).
		return rlqs.Over
	default:
		return rlqs.Unavailable // fail_closed, or emergency past its allowance
	}
}
