package agent

// How a request's steps become its answer, and what a denied request's
// charges give back.

import (
	"context"
	"math"
	"time"
)

func verdict(allowed bool) Reason {
	if allowed {
		return ReasonOK
	}
	return ReasonOverLimit
}

// combine folds one request's steps into its answer, dst. The answer is
// written in place, field by field: a Response built as a composite
// literal and returned is copied through the stack in wide moves that
// stall on the narrow stores just made.
func (s *Service) combine(dst *Response, steps []step) {
	switch len(steps) {
	case 0:
		*dst = Response{Allowed: true, Reason: ReasonNoRule}
		return
	case 1:
		// What the loop below makes of a lone step.
		st := &steps[0]
		switch {
		case st.rule.Shadow:
			respond(dst, st, true, ReasonShadow)
		case !st.allowed:
			respond(dst, st, false, st.reason)
		case st.reason == ReasonUnavailable || st.reason == ReasonEmergency:
			respond(dst, st, true, st.reason)
		default:
			respond(dst, st, true, ReasonOK)
		}
		return
	}
	var deny, shadow, tightest *step
	var sawUnavailable, sawEmergency bool
	for i := range steps {
		st := &steps[i]
		// A shadow rule decided by its failure policy says nothing of how
		// the rules in force decided: it would report an answer they made
		// on their buckets as made without the store (and the check
		// endpoint would leave out the quota fields it has).
		switch {
		case st.rule.Shadow:
		case st.reason == ReasonUnavailable:
			sawUnavailable = true
		case st.reason == ReasonEmergency:
			sawEmergency = true
		}
		if !st.allowed {
			if st.rule.Shadow {
				if shadow == nil {
					shadow = st
				}
				continue
			}
			// A spent quota (429) outranks an unreachable store (503): the
			// client learns the truer of the two reasons to wait.
			if deny == nil || (deny.reason == ReasonUnavailable && st.reason != ReasonUnavailable) {
				deny = st
			}
			continue
		}
		if !st.rule.Shadow && (tightest == nil || fraction(st) < fraction(tightest)) {
			tightest = st
		}
	}
	switch {
	case deny != nil:
		respond(dst, deny, false, deny.reason)
		return
	case tightest == nil && shadow != nil:
		respond(dst, shadow, true, ReasonShadow)
		return
	case tightest == nil:
		respond(dst, &steps[0], true, ReasonShadow)
		return
	}
	r := ReasonOK
	switch {
	case sawUnavailable:
		r = ReasonUnavailable
	case sawEmergency:
		r = ReasonEmergency
	case shadow != nil:
		r = ReasonShadow
	}
	respond(dst, tightest, true, r)
}

func fraction(st *step) float64 { return st.res.Remaining / st.req.Limit.Burst }

// maxAdvisedWait caps, in seconds, the Retry-After respond makes up for a
// bucket that did not say.
const maxAdvisedWait = 24 * 3600

// respond makes dst the answer of st with allowed and r.
func respond(dst *Response, st *step, allowed bool, r Reason) {
	dst.Allowed, dst.Reason, dst.RetryAfter = allowed, r, 0
	dst.Remaining, dst.Limit, dst.Rate, dst.Reset = st.res.Remaining, st.req.Limit.Burst, st.req.Limit.Rate, st.res.Reset
	dst.Rule = st.rule.Name
	dst.fundFor = 0
	if !allowed {
		dst.RetryAfter = st.res.RetryAfter
		dst.fundFor = st.fundFor
		if dst.RetryAfter <= 0 && r != ReasonUnavailable && st.req.Limit.Rate > 0 {
			// The deciding bucket did not say (a lease granted empty:
			// the rule's tokens sit with other agents, and its own
			// refill is 0). The rule refills the cost in cost/rate; a
			// 429 always says when to retry.
			dst.RetryAfter = time.Duration(math.Ceil(min(max(st.req.Cost, 1)/st.req.Limit.Rate, maxAdvisedWait) * float64(time.Second)))
		}
		dst.Reset = max(dst.Reset, dst.RetryAfter)
	}
}

// refund gives back what admitted rules took from requests that ended
// denied, so a request that does not proceed costs nothing anywhere.
func (s *Service) refund(ctx context.Context, steps []step, out []Response) {
	var ctxRefund context.Context
	var cancel context.CancelFunc
	for i := range steps {
		st := &steps[i]
		if !st.charged || out[st.item].Allowed {
			continue
		}
		switch st.path {
		case pathRedis:
			// Tokens go back: a remembered denial of the bucket may no
			// longer hold.
			s.denials.forget(st.req.Key)
			if ctxRefund == nil {
				ctxRefund, cancel = s.bound(ctx)
			}
			if err := s.store.Refund(ctxRefund, st.req); err != nil {
				// Losing a refund under-admits; it never over-admits.
				s.metrics.storeErrors.WithLabelValues("refund").Inc()
			}
		case pathLeased:
			s.leases.Refund(st.src, st.req.Cost)
		case pathFallback:
			s.fallback.refund(ctx, st)
		}
		s.metrics.refunds.Inc()
	}
	if cancel != nil {
		cancel()
	}
}
