package rlqs

// Sizing a bucket's next action from the rules it matches and the leases
// that fund them.

import (
	"context"
	"math"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
)

// verdict is one rule's say on a bucket's assignment.
type verdict int

const (
	vOpen   verdict = iota // does not limit it
	vFunded                // a token bucket, lent from its lease
	vSizes                 // a token bucket of given sizes, unfunded (emergency)
	vDeny
)

// assign decides a bucket's next action at now, lending what it funds.
// n is the requests of the report (the first report of a bucket with no
// request is still answered: Envoy waits for an assignment).
func (st *stream) assign(ctx context.Context, b *bucketState, now int64, demand, n float64) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	o := &st.s.o
	var matches []rules.Match
	if o.Rules != nil {
		matches = o.Rules.Current().Match(b.pairs, nil)
	}
	delta := o.Delta.Microseconds()
	limit := sizes{burst: math.MaxUint32, rate: math.MaxUint32, ttl: int64(o.MaxTTL / time.Second)}
	deny, fail, limited := false, false, false
	type lent struct {
		lt    *loanTab
		f     *fund
		sizes sizes
	}
	var loans []lent
	// Whatever is decided, an action for b is sent now: it ends the last
	// one by now + Delta (before any new loan is recorded, which it must
	// not cut).
	st.cutAll(b, now)
	for _, m := range matches {
		r := m.Rule
		if r.Shadow || r.Mode != rules.ModeLeased || r.Lease.DefaultShare > 0 {
			// Redis-mode, auto and default-share rules are RLS's to
			// decide (docs/integrations/envoy-rlqs.md); shadow rules
			// never deny.
			st.s.warnUnfunded(r)
			continue
		}
		limited = true
		var z sizes
		var got, gotRate, held float64
		var loan holder.Loan
		ok := false
		key := r.Name + "\x00" + m.Subject
		f := b.funds[key]
		var prev *loanTab
		if f != nil && len(f.tabs) > 0 {
			prev = f.tabs[len(f.tabs)-1]
		}
		if o.Funds != nil {
			w := smaller(want(r, demand, limit.ttl), limit)
			share := st.s.shares.set(key, b, demand)
			var pl holder.Loan
			if prev != nil {
				pl, held = prev.loan, prev.t.rate
			}
			loan, got, gotRate, ok = o.Funds.Lend(ctx, r, m.Subject, now, pl, held, func(of holder.Offer) (float64, float64) {
				zz, fits := fit(w, offer{tokens: of.Tokens, rate: of.Rate, leaseRate: of.LeaseRate, share: share, validUntil: of.ValidUntil}, now, delta)
				if !fits {
					return 0, 0
				}
				z = zz
				return z.burst, z.rate
			})
		}
		switch {
		case !ok:
			fail = true
			switch v, zz := failure(r, o.Funds); v {
			case vDeny:
				deny = true
			case vSizes:
				limit = smaller(limit, zz)
			}
		case got == 0 && gotRate == 0:
			deny = true // the lease funds nothing now: its budget is spent
		default:
			// The lease lent gotRate beyond the rate the superseded
			// loan held (lease.Holding.Lend).
			st.s.rates.change(now, max(0, gotRate-held))
			if f == nil {
				f = &fund{rule: r, subject: m.Subject}
				b.funds[key] = f
			}
			lt := prev
			if lt == nil || lt.loan != loan {
				lt = &loanTab{loan: loan, t: newTab(delta, o.Grace.Microseconds())}
				f.tabs = append(f.tabs, lt)
			}
			c, l := lt.t.assign(now, z.burst, z.rate, z.ttl*1e6)
			st.apply(lt, c)
			if math.Abs(l.lend-got) > 1e-6 || math.Abs(l.lendRate-gotRate) > 1e-6 {
				// The plan and the tab size a loan alike; a mismatch is a
				// bug: repay the loan and lend nothing.
				tok, rate := lt.t.unassign()
				o.Funds.Repay(loan, tok, rate, tok)
				st.s.rates.change(now, -rate)
				deny = true
				continue
			}
			limit = smaller(limit, z)
			loans = append(loans, lent{lt, f, z})
		}
	}
	action := &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: b.id}
	var strategy *typev3.RateLimitStrategy
	ttl := int64(o.OpenTTL / time.Second)
	switch {
	case deny:
		strategy = blanket(typev3.RateLimitStrategy_DENY_ALL)
		ttl = int64(o.FailTTL / time.Second)
	case !limited || (fail && limit.rate == math.MaxUint32 && len(loans) == 0):
		strategy = blanket(typev3.RateLimitStrategy_ALLOW_ALL)
		if fail {
			ttl = int64(o.FailTTL / time.Second)
		}
	default:
		if fail {
			limit.ttl = min(limit.ttl, int64(o.FailTTL/time.Second))
		}
		strategy = tokenBucket(limit)
		ttl = limit.ttl
	}
	b.until = 0
	if strategy.GetTokenBucket() == nil {
		// Nothing lent is sent: the loans go back whole.
		for _, l := range loans {
			tok, rate := l.lt.t.unassign()
			o.Funds.Repay(l.lt.loan, tok, rate, tok)
			st.s.rates.change(now, -rate)
		}
	} else {
		if len(loans) > 0 && !fail {
			b.until = now + ttl*1e6
		}
		for _, l := range loans {
			st.s.m.lent.Add(l.lt.t.as[len(l.lt.t.as)-1].cap)
			if l.sizes != limit {
				st.apply(l.lt, l.lt.t.lower(limit.burst, limit.rate, limit.ttl*1e6))
			}
		}
	}
	action.BucketAction = &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
		QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(time.Duration(ttl) * time.Second),
			RateLimitStrategy:    strategy,
		},
	}
	return action
}

// failure is a rule's failure policy as an assignment, when its lease
// cannot decide (no valid lease: the coordinators are unreachable).
func failure(r *rules.Rule, funds Funds) (verdict, sizes) {
	switch r.OnFailure {
	case rules.FailOpen:
		return vOpen, sizes{}
	case rules.Emergency:
		if funds == nil || funds.DownFor() > r.Emergency.MaxDuration {
			return vDeny, sizes{}
		}
		z := sizes{burst: max(1, math.Floor(r.Emergency.Burst)), rate: max(1, math.Floor(r.Emergency.Rate)), ttl: 1}
		if r.Emergency.Burst < 1 {
			return vDeny, sizes{}
		}
		return vSizes, z
	default:
		return vDeny, sizes{}
	}
}

func blanket(b typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: b}}
}

func tokenBucket(z sizes) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(z.burst),
		TokensPerFill: wrapperspb.UInt32(uint32(z.rate)),
		FillInterval:  durationpb.New(time.Second),
	}}}
}

// cutAll records that an action for b is sent at now: every tab's last
// assignment ends by now + Delta.
func (st *stream) cutAll(b *bucketState, now int64) {
	for _, f := range b.funds {
		for _, lt := range f.tabs {
			st.apply(lt, lt.t.cut(now))
		}
	}
}

// warnUnfunded logs, once per rule, that a bucket matched a rule RLQS does
// not enforce: its requests are admitted without it, which an operator
// who meant it to limit Envoy's traffic must learn from somewhere.
func (s *Server) warnUnfunded(r *rules.Rule) {
	if r.Shadow {
		return
	}
	if _, seen := s.unfunded.LoadOrStore(r.Name, true); seen {
		return
	}
	why := "mode " + r.Mode.String()
	if r.Mode == rules.ModeLeased {
		why = "a lease.default_share"
	}
	s.o.Logger.Warn("an RLQS bucket matched a rule RLQS does not enforce: its requests are admitted by it (ALLOW_ALL); enforce the rule with Envoy's RLS filter",
		"rule", r.Name, "because", why)
}
