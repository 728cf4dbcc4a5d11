package agent

import (
	"context"
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
)

// Handle is one (rule, subject) checked once, for a caller in the same
// process that decides it often: an embedded gateway's hot tenant, a
// global quota. Decide answers what Service.Decide answers for
// Request{Rule, Subject, Cost}. A mode: leased rule's decision on a valid
// lease is made by the Handle itself: no matching, no validation beyond
// the cost, no quota lookup, one clock read. Everything else (a Redis
// rule, a quota's first grant, a lease that is not valid, a reload of the
// rules, recording to the admission log) goes through Service.Decide, so
// the Handle never decides differently from it.
type Handle struct {
	s             *Service
	rule, subject string
	cur           atomic.Pointer[handleState]
}

// handleState is what a Handle found against one rules set.
type handleState struct {
	set   *rules.Set
	rule  *rules.Rule // nil: the request is invalid against set (Decide reports it)
	limit bucket.Limit
	// fast: decided on ref's lease when it is valid. ref is the zero Ref
	// until the quota's first Spend has added it.
	fast            bool
	ref             holder.Ref
	allowed, denied prometheus.Counter
}

// leaseRefs is the optional part of Leases (holder.Leases has it) that a
// Handle's fast path needs.
type leaseRefs interface {
	Ref(r *rules.Rule, subject string) holder.Ref
}

// Handle checks (rule, subject) against the rules in force as Decide
// would check Request{Rule: rule, Subject: subject} (the error is the
// same: ErrInvalidRequest, with ErrUnknownRule for a rule not loaded) and
// returns its Handle. A later reload is followed: Decide then reports
// what is wrong with the pair under the new rules, if anything.
func (s *Service) Handle(rule, subject string) (*Handle, error) {
	h := &Handle{s: s, rule: rule, subject: subject}
	if err := h.refresh(s.rules.Current()); err != nil {
		return nil, err
	}
	return h, nil
}

// refresh finds the pair's rule, limit and quota in set.
func (h *Handle) refresh(set *rules.Set) error {
	s := h.s
	hs := &handleState{set: set}
	defer h.cur.Store(hs)
	// The smallest cost validates everything but the cost, which Decide
	// checks per call.
	req := Request{Rule: h.rule, Subject: h.subject, Cost: math.SmallestNonzeroFloat64}
	var mb [1]rules.Match
	m, err := s.match(set, &req, mb[:0])
	if err != nil {
		return err
	}
	var sb [1]step
	steps, err := s.prepare(set, sb[:0], m, &req, 0)
	if err != nil {
		return err
	}
	st := &steps[0]
	hs.rule, hs.limit = st.rule, st.req.Limit
	if st.rule.Mode == rules.ModeLeased && s.refs != nil && s.rec == nil {
		hs.fast = true
		hs.ref = s.refs.Ref(st.rule, h.subject)
		hs.allowed = s.metrics.ruleDecision(st.rule, pathLeased, true, ReasonOK)
		hs.denied = s.metrics.ruleDecision(st.rule, pathLeased, false, ReasonOverLimit)
	}
	return nil
}

// Decide decides cost tokens (0 means 1) of the Handle's rule and subject
// into r (a Response is large: filled in place, it is not copied on the
// way back to the caller).
func (h *Handle) Decide(ctx context.Context, cost float64, r *Response) error {
	s := h.s
	if cost == 0 {
		cost = 1
	}
	hs := h.cur.Load()
	// cost ≤ burst also refuses NaN and ±Inf; the rules set is compared
	// by pointer, so a reload sends the next decision the long way.
	if hs.fast && cost > 0 && cost <= hs.limit.Burst && hs.set == s.rules.Current() {
		if allowed, remaining, reset, retryAfter, ok := hs.ref.Spend(cost); ok {
			hs.respond(r, allowed, remaining, reset, retryAfter)
			return nil
		}
	}
	var err error
	*r, err = s.Decide(ctx, Request{Rule: h.rule, Subject: h.subject, Cost: cost})
	if set := s.rules.Current(); set != hs.set {
		h.refresh(set) // an error is Decide's to report, every time
	} else if hs.fast {
		// The long way may have added the quota (a first decision) or
		// found it again (forgotten for idleness): take its Ref.
		if ref := s.refs.Ref(hs.rule, h.subject); ref != hs.ref {
			next := *hs
			next.ref = ref
			h.cur.CompareAndSwap(hs, &next)
		}
	}
	return err
}

// respond makes r the answer, and counts the decision, of a decision made
// on the lease: what combine and observe make of one leased step.
func (hs *handleState) respond(r *Response, allowed bool, remaining float64, reset, retryAfter time.Duration) {
	// Field by field: a composite literal is built on the stack and copied
	// in wide moves that stall on the narrow stores just made.
	r.Allowed, r.Reason, r.RetryAfter = allowed, ReasonOK, 0
	r.Remaining, r.Limit, r.Rate, r.Reset = remaining, hs.limit.Burst, hs.limit.Rate, reset
	r.Rule = hs.rule.Name
	switch {
	case allowed:
		hs.allowed.Inc()
		if hs.rule.Shadow {
			r.Reason = ReasonShadow
		}
	case hs.rule.Shadow:
		hs.denied.Inc()
		r.Allowed, r.Reason = true, ReasonShadow
	default:
		hs.denied.Inc()
		r.Reason, r.RetryAfter = ReasonOverLimit, retryAfter
	}
}
