package rlqs

// A bucket's next action, from the rules it matches: which of them lend it
// (leased rules) and which take it (take.go), then the action their
// answers make.

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

// verdict is a failure policy's say on a bucket's assignment.
type verdict int

const (
	vOpen  verdict = iota // does not limit it
	vSizes                // a token bucket of given sizes, unfunded (emergency)
	vDeny
)

// plan is what the rules a bucket matches say of its next action, as
// lending and taking build it.
type plan struct {
	// limit is the smallest assignment of the rules that size one (a
	// loan, a take, an emergency policy); its rate is MaxUint32 while
	// none does.
	limit sizes
	// funded: a loan or a take pays for the assignment, which may then
	// stand until it is about to lapse (renewDue).
	funded bool
	// fail: a failure policy decided for a rule: the action's TTL is
	// FailTTL and the next report asks again.
	fail bool
	deny bool
	// denyTTL is, for a denial by spent quotas only, when they may fund
	// the bucket again (seconds); the denial stands that long. 0: the
	// denial lasts FailTTL and the next report asks again.
	denyTTL int64
	// retry: a denial that the next report must ask about again (a
	// failure policy's, a spent lease's); denyTTL is then not kept.
	retry bool
	loans []lent
	// single: the bucket matches one rule, which lends: only then may an
	// unchanged assignment be carried on (lend).
	single bool
	// emergency: leased rules whose lease cannot decide and whose policy
	// is local_emergency, to be taken from the agent's emergency bucket
	// with the other takes (fallBack).
	emergency []rules.Match
	// takenAt is, for an assignment a take funds, when its first take
	// started (the funds' clock, µs); 0 otherwise. It must be sent within
	// SendMargin of it (stream.send).
	takenAt int64
}

// lent is one loan made for the action being built.
type lent struct {
	lt    *loanTab
	f     *fund
	sizes sizes
}

// assign decides a bucket's next action, taking and lending what funds
// it (lend and take: the rules it matches, match); demand is its requests
// per second as last reported. It returns the action and now, the time it
// is recorded as sent at, which the caller sends without delay.
//
// The takes come first: each waits on a store. Then the clock is read
// once for the cut of the last action, the loans and the action: a loan
// is recorded as sent at now, and ends (in the tab and before the
// lease's validity) counted from it, so nothing slow may come between
// now and the send. (A take is held from its own start, stream.send.)
// Only a leased local_emergency rule whose lease cannot decide is taken
// after the loans (fallBack): the coordinators are then unreachable, and
// the other loans of the bucket, if any, rarely live.
func (st *stream) assign(ctx context.Context, b *bucketState, demand float64, lend, take []rules.Match) (*rlqsv3.RateLimitQuotaResponse_BucketAction, int64) {
	p := &plan{limit: sizes{burst: math.MaxUint32, rate: math.MaxUint32, ttl: int64(st.s.o.MaxTTL / time.Second)}}
	p.single = len(lend) == 1 && len(take) == 0
	st.take(ctx, b, demand, take, p)
	now := st.s.now()
	b.retry = 0
	// Whatever is decided, an action for b is sent now: it ends the last
	// one by now + Delta (before any new loan is recorded, which it must
	// not cut).
	st.cutAll(b, now)
	if !p.deny {
		for _, m := range lend {
			st.lend(ctx, b, now, demand, m, p)
		}
		st.take(ctx, b, demand, p.emergency, p)
	}
	return st.act(b, now, p), now
}

// match splits the rules b matches: leased rules lend its assignment out
// of the agent's lease of their quota (tab.go); the others (mode redis,
// mode auto, lease.default_share) take it (take.go). Shadow rules never
// deny and do neither.
func (st *stream) match(b *bucketState) (lend, take []rules.Match) {
	if st.s.o.Rules == nil {
		return nil, nil
	}
	for _, m := range st.s.o.Rules.Current().Match(b.pairs, nil) {
		switch r := m.Rule; {
		case r.Shadow:
		case r.Mode == rules.ModeLeased && r.Lease.DefaultShare == 0:
			lend = append(lend, m)
		default:
			take = append(take, m)
		}
	}
	return lend, take
}

// lend lends b's assignment for leased rule m out of the agent's lease of
// its quota, sized to what the lease offers and b's share of its demand.
func (st *stream) lend(ctx context.Context, b *bucketState, now int64, demand float64, m rules.Match, p *plan) {
	o := &st.s.o
	r := m.Rule
	if o.Funds == nil {
		st.fallBack(m, p)
		return
	}
	delta := o.Delta.Microseconds()
	key := r.Name + "\x00" + m.Subject
	f := b.funds[key]
	if f == nil {
		// Recorded before anything is lent: b's reports count as the
		// quota's demand (server.go) while it waits for a share too, or
		// a lease granted empty would never be asked to grow.
		f = &fund{rule: r, subject: m.Subject}
		b.funds[key] = f
	}
	var prev *loanTab
	if len(f.tabs) > 0 {
		prev = f.tabs[len(f.tabs)-1]
	}
	var z sizes
	var held float64
	var pl holder.Loan
	if prev != nil {
		pl, held = prev.loan, prev.t.rate
	}
	w := smaller(want(r, demand, p.limit.ttl), p.limit)
	st.s.shares.set(key, b, demand, r.Rate)
	// The last action sent for b is this tab's last assignment: one of
	// the same sizes now is carried on by Envoy (tab.carries).
	carry := !o.NoCarry && p.single && prev != nil && b.lastSent != 0 &&
		len(prev.t.as) > 0 && prev.t.as[len(prev.t.as)-1].sent == b.lastSent &&
		now+delta < b.lastSent+b.last.ttl*1e6 // Envoy still holds it (tab.carries)
	turnOver := f.turn != 0 && now-f.turn >= turn.Microseconds()
	// Lend never waits for a new quota's first grant: the loan is
	// recorded as sent at now. A quota still cold is asked about again
	// at the next report.
	loan, got, gotRate, ok := o.Funds.Lend(ctx, r, m.Subject, now, pl, held, func(of holder.Offer) (float64, float64) {
		// Of what fit may lend of the lease's rate, as the quota's
		// demands stand now.
		share, n := st.s.shares.share(key, b, of.LeaseRate*(1-reserve), int(of.Cap/2))
		ov := offer{tokens: of.Tokens, rate: of.Rate, leaseRate: of.LeaseRate, share: share, validUntil: of.ValidUntil,
			// A burst of its part of the cap, so that as many buckets
			// as may hold a token at once can be funded side by side.
			maxBurst: max(1, math.Floor(of.Cap/float64(2*max(1, n))))}
		if st.s.shares.yield(key, b, f.turn, now, of.Tokens, b.last.rate) {
			// Its turn is over and others wait: it waits behind them.
			// The loan it holds ends with the denial sent now, and its
			// max_tokens comes back under the lease's cap once settled.
			return 0, 0
		}
		ahead := st.s.shares.ahead(key, b)
		if carry {
			// Kept unless it holds more than its fair part of the rate
			// (it came when fewer buckets shared it) and its turn is
			// over, or it may grow (fewer share the rate now). Never
			// re-sent as a new bucket of the same sizes to refill it:
			// Envoy starts a replacing bucket at the fill ratio of the
			// one in force, so a spent bucket would get nothing from the
			// M it was charged.
			resize := turnOver && b.last.rate > 1.05*share && of.Tokens >= 1
			if best, _, ok := rateWithin(min(w.rate, ov.lendable(), share)); ok && b.last.rate < 0.95*best && of.Tokens >= float64(2+ahead) {
				resize = true
			}
			if !resize {
				if zz, keep := keeps(b.last, w, ov, now, delta); keep && of.Continues {
					z = zz
					return 0, z.rate
				}
			}
			carry = false
		}
		if float64(ahead) > of.Tokens-1 {
			return 0, 0 // the tokens are for the buckets that waited longer
		}
		zz, fits := fit(w, ov, now, delta)
		if !fits {
			if ahead == 0 && p.single {
				// First in line, or the lease's validity is too short
				// for a second's TTL now: it may fund b in a moment.
				b.retry = now + renewCheck.Microseconds()
			}
			return 0, 0
		}
		z = zz
		return z.burst, z.rate
	})
	switch {
	case !ok && o.Funds.DownFor() == 0:
		// No valid lease while the coordinators answer: the quota's
		// first grant is on its way (or a lease is being replaced). Not
		// a failure: its policy (fail_open would admit all) does not
		// apply; a short denial asks again, soon.
		p.deny, p.retry = true, true
		if p.single {
			b.retry = now + renewCheck.Microseconds()
		}
		return
	case !ok:
		st.fallBack(m, p)
		return
	case got == 0 && gotRate == 0:
		// The lease funds nothing now: its budget is spent, or lent to
		// the quota's other buckets. b waits for its turn.
		st.s.shares.waitFor(key, b, now)
		f.turn = 0
		p.deny, p.retry = true, true
		return
	}
	st.s.shares.funded(key, b)
	if !carry && turnOver {
		f.turn = now // a new turn, at its new size
	}
	// The lease lent gotRate beyond the rate the superseded loan held
	// (lease.Holding.Lend).
	st.s.rates.change(now, max(0, gotRate-held))
	if f.turn == 0 {
		f.turn = now
	}
	lt := prev
	if lt == nil || lt.loan != loan {
		lt = &loanTab{loan: loan, t: newTab(delta, o.Grace.Microseconds())}
		f.tabs = append(f.tabs, lt)
	}
	c, l := lt.t.assign(now, z.burst, z.rate, z.ttl*1e6, carry)
	st.apply(lt, c)
	if math.Abs(l.lend-got) > 1e-6 || math.Abs(l.lendRate-gotRate) > 1e-6 {
		// The plan and the tab size a loan alike; a mismatch is a bug:
		// repay what the lease lent (not what the tab counted) and lend
		// nothing.
		_, rate := lt.t.unassign()
		o.Funds.Repay(loan, got, rate, got)
		o.Logger.Error("rlqs: a loan and its tab disagree; the bucket is denied for now", "rule", r.Name, "lent", got, "tab", l.lend, "rate", gotRate, "tab_rate", l.lendRate)
		st.s.rates.change(now, -rate)
		p.deny, p.retry = true, true
		return
	}
	p.limit = smaller(p.limit, z)
	p.funded = true
	p.loans = append(p.loans, lent{lt, f, z})
}

// fallBack applies leased rule m's failure policy when its lease cannot
// decide (no valid lease: the coordinators are unreachable). With a Taker,
// local_emergency is taken (take.go) as any request of the rule would be
// decided now: by the agent's emergency bucket for the rule and subject,
// held for as long as Envoy may spend it, so that every Envoy and direct
// caller of this agent shares one emergency.burst + emergency.rate*T, and
// denied past max_duration. (An unfunded token bucket of the emergency
// sizes would give each Envoy bucket its own.) Its TTL is FailTTL: the
// next report asks the lease again.
func (st *stream) fallBack(m rules.Match, p *plan) {
	r := m.Rule
	p.fail = true
	if r.OnFailure == rules.Emergency && st.s.o.Taker != nil {
		p.limit.ttl = min(p.limit.ttl, int64(st.s.o.FailTTL/time.Second))
		p.emergency = append(p.emergency, m)
		return
	}
	switch v, z := failure(r, st.s.o.Funds); v {
	case vDeny:
		p.deny, p.retry = true, true
	case vSizes:
		p.limit = smaller(p.limit, z)
	}
}

// act makes the action of plan p for b, sent at now: it repays the loans
// if nothing they funded is sent, or lowers them to the assignment sent.
func (st *stream) act(b *bucketState, now int64, p *plan) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	o := &st.s.o
	var strategy *typev3.RateLimitStrategy
	ttl := int64(o.OpenTTL / time.Second)
	b.until = 0
	carried := false
	for _, l := range p.loans {
		a := l.lt.t.as[len(l.lt.t.as)-1]
		carried = carried || a.carried
		if a.carried && l.sizes != p.limit {
			// Envoy would start a new bucket, which no loan paid for
			// (lend carries only a bucket that one rule sizes alone).
			p.deny, p.retry = true, true
		}
	}
	switch {
	case p.deny:
		strategy = blanket(typev3.RateLimitStrategy_DENY_ALL)
		ttl = int64(o.FailTTL / time.Second)
		if !p.retry && p.denyTTL > 0 {
			// Spent quotas that fund nothing before denyTTL: the denial
			// stands until then, unasked.
			ttl = p.denyTTL
			b.until = now + ttl*1e6
		}
	case p.limit.rate == math.MaxUint32:
		// Nothing sizes an assignment: no rule limits the bucket, or only
		// failure policies that admit.
		strategy = blanket(typev3.RateLimitStrategy_ALLOW_ALL)
		if p.fail {
			ttl = int64(o.FailTTL / time.Second)
		}
	default:
		if p.fail {
			p.limit.ttl = min(p.limit.ttl, int64(o.FailTTL/time.Second))
		}
		strategy = tokenBucket(p.limit)
		ttl = p.limit.ttl
		if p.funded && !p.fail {
			b.until = now + ttl*1e6
		}
	}
	if strategy.GetTokenBucket() != nil && b.lastSent != 0 && same(p.limit, b.last) {
		// Carried on: the bucket Envoy holds, of the same generation.
		// Otherwise its max_tokens was lent or taken anew, and Envoy
		// must start a new bucket with them, not carry on the one it
		// holds: the other generation.
		p.limit.gen = b.last.gen
		if !carried {
			p.limit.gen = !b.last.gen
		}
		strategy = tokenBucket(p.limit)
	}
	b.takenAt, b.lastSent, b.lent = 0, 0, false
	if strategy.GetTokenBucket() != nil {
		b.takenAt = p.takenAt
		b.last, b.lastSent = p.limit, now
		b.lent = p.funded && p.takenAt == 0 && len(p.loans) > 0
	}
	if strategy.GetTokenBucket() == nil {
		// Nothing lent is sent: the loans go back whole.
		for _, l := range p.loans {
			tok, rate := l.lt.t.unassign()
			o.Funds.Repay(l.lt.loan, tok, rate, tok)
			st.s.rates.change(now, -rate)
		}
	} else {
		for _, l := range p.loans {
			if a := l.lt.t.as[len(l.lt.t.as)-1]; !a.carried {
				st.s.m.lent.Add(a.cap)
			}
			if l.sizes != p.limit {
				st.apply(l.lt, l.lt.t.lower(p.limit.burst, p.limit.rate, p.limit.ttl*1e6))
			}
		}
	}
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: b.id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(time.Duration(ttl) * time.Second),
				RateLimitStrategy:    strategy,
			},
		},
	}
}

// failure is a leased rule's failure policy as an assignment, when its
// lease cannot decide (no valid lease: the coordinators are unreachable).
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
	f, k := z.perFill()
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(z.burst),
		TokensPerFill: wrapperspb.UInt32(f),
		FillInterval:  &durationpb.Duration{Seconds: k, Nanos: intervalNanos(k, z.gen)},
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
