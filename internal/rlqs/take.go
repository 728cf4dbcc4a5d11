package rlqs

// Assignments funded by a take: for a rule RLQS does not lend for (mode
// redis, mode auto, lease.default_share), everything Envoy could spend
// under the assignment is charged, through the agent's own decision path,
// before it is sent.
//
// # What Envoy can spend
//
// Under a token bucket assignment {M, f, TTL t} sent at s, Envoy's bucket
// starts with at most M (full, or the level it carries on, which an
// earlier assignment paid for) and refills at f from its receipt (by
// s + delta) until its expiry (at most t later) or its replacement: at
// most M + f*(t + delta) in all (tab.go has the timing). That is the cost
// c of the take. The whole of it is charged for every assignment sent:
// Envoy may start a fresh, full bucket on each.
//
// # The bound
//
// The take is decided as any request of cost c is (agent.Service.Decide):
// by the rule's store bucket, by the lease of a promoted auto subject or
// of a default-share subject, or by the failure policy (the agent's
// emergency bucket for local_emergency). Whichever bucket decides counts
// c before Envoy can spend any of it, and holds it (bucket.Request.HeldFor)
// for as long as Envoy may spend it (spendFor): until then the bucket
// refills to B less what is held, never to B behind tokens Envoy has yet
// to spend. So over any window [a, a+T] what the bucket admits directly
// plus what Envoy spends under taken assignments is at most what it held
// at a (tokens and held, together at most B) plus its refill, r*T: within
// B + r*T over every window (bucket/model.go, take). A lease decides a
// held take by lending its cost for as long (holder.Leases.SpendHeld), and
// refuses it when the hold would outlast the lease's validity or a
// promoted subject's mark (Taken.Short): the take is asked again with a
// TTL short enough, if one of at least 1s fits, else denied for a while.
// A promoted auto subject's mark runs about its hold (auto.hold, 2s by
// default) ahead, so at the default TakeTTL of 2s its assignments get a
// TTL of 1s; with a hold under about 1.6s, none fits and the bucket is
// denied (DENY_ALL for a second at a time) while the subject is promoted:
// drive such a subject with RLS, or raise its hold.
//
// What it costs: nothing of a take comes back. A bucket that carries on
// (Envoy keeps a bucket whose sizes did not change) or whose assignment
// is replaced before its end spent less than c; the rest is gone. So a
// taken assignment is sent again only when it is about to lapse
// (renewDue), its TTL is short (a lapse costs little) and its burst small
// (every send pays it again).

import (
	"context"
	"math"
	"time"

	"github.com/ration-dev/ration/internal/rules"
)

// Taker decides a take through the agent's own decision path
// (agent.Service.Decide for the rule and subject, of the given cost). The
// take is held (bucket.Request.HeldFor): Envoy may spend its tokens for
// up to spend after the take starts (real time; the Taker allows for its
// store's clock), and the bucket that decides it must not refill behind
// them until then. An error means the take can never be decided as asked
// (an invalid request: the rule cannot be enforced by RLQS).
type Taker interface {
	Take(ctx context.Context, r *rules.Rule, subject string, cost float64, spend time.Duration) (Taken, error)
}

// SendMargin bounds the time from a take's start to the sending of the
// assignment it funds. A take is held for SendMargin + TTL + Delta
// (spendFor): Envoy receives the assignment by send + Delta and applies
// it for at most its TTL. An assignment not sent within SendMargin of its
// take (a report naming many buckets, each take waiting on a slow store)
// is not sent: a short DENY_ALL goes instead (stream.send), and the take
// is lost, as any take's unspent part.
const SendMargin = 250 * time.Millisecond

// spendFor is how long after a take's start Envoy may spend under the
// assignment it funds, of TTL ttl seconds.
func spendFor(ttl int64, delta time.Duration) time.Duration {
	return SendMargin + time.Duration(ttl)*time.Second + delta
}

// Taken is a take's answer.
type Taken struct {
	Outcome Outcome
	// RetryAfter is, for Over, when the quota may hold the cost again.
	RetryAfter time.Duration
	// Short is, for Over, that the quota refused the take only because it
	// would be held longer than the lease deciding it may be spent (a
	// lease's validity, a promotion's mark), charging nothing; a take
	// held for at most Within (the Taker's spend) could be funded now.
	Short  bool
	Within time.Duration
}

// Outcome is what a take did.
type Outcome uint8

const (
	// Funded: the cost was counted (by the store, a lease, or the
	// agent's emergency bucket).
	Funded Outcome = iota + 1
	// Open: the rule's dependency is down and its failure policy
	// (fail_open) admits; nothing was counted.
	Open
	// Over: the quota lacks the cost.
	Over
	// Unavailable: the rule's dependency is down and its failure policy
	// denies.
	Unavailable
	// Gone: the rule is no longer in force (the rules were reloaded since
	// the bucket was matched).
	Gone
)

var outcomeNames = [...]string{"unspecified", "funded", "open", "over_limit", "unavailable", "gone"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "unknown"
}

// minTake is the smallest assignment: one token, one a second, for a
// second.
var minTake = sizes{burst: 1, rate: 1, ttl: 1}

// cost is what Envoy can spend under z, delta being the delivery and
// timer margin (µs): its burst, and its refill for its TTL and delta.
func cost(z sizes, delta int64) float64 {
	return z.burst + z.rate*(float64(z.ttl)+float64(delta)/1e6)
}

// takeWant is the assignment a take would fund for a bucket of rule r
// whose Envoy asks for demand tokens per second, when the bucket that
// decides its takes holds at most burst, with a TTL of ttl: want's rate;
// as burst half a second of that rate (Envoy refills continuously, so a
// bucket of half a second absorbs a steady client's jitter; more would be
// paid again on every send, and Envoy mostly carries on what it has);
// and a cost within half the store's burst (the rest is for other Envoys
// and direct callers), the rate cut to fit. ok is false when not even
// minTake fits the store's burst.
func takeWant(r *rules.Rule, burst, demand float64, ttl, delta int64) (sizes, bool) {
	if cost(minTake, delta) > burst {
		return sizes{}, false
	}
	z := want(r, demand, ttl)
	z.burst = max(1, min(z.burst, math.Ceil(z.rate/2)))
	budget := max(burst/2, cost(minTake, delta))
	if cost(z, delta) <= budget {
		return z, true
	}
	// burst <= rate/2 + 1/2, so this rate's cost is within the budget
	// unless it is held up at 1.
	life := float64(z.ttl) + float64(delta)/1e6
	z.rate = max(1, math.Floor((budget-1)/(life+0.5)))
	z.burst = max(1, min(z.burst, math.Ceil(z.rate/2)))
	if cost(z, delta) > budget {
		return minTake, true
	}
	return z, true
}

// take funds b's assignment for the rules ms, which RLQS does not lend
// for: it sizes it (the smallest of the loans', the policies' and each
// rule's takeWant), then takes its whole cost from each rule. A take the
// quota cannot pay is asked once more, smaller (retry); one still denied
// denies the bucket, and the takes after it are not made.
func (st *stream) take(ctx context.Context, b *bucketState, demand float64, ms []rules.Match, p *plan) {
	if len(ms) == 0 || p.deny {
		return
	}
	o := &st.s.o
	delta := o.Delta.Microseconds()
	z := p.limit
	z.ttl = min(z.ttl, int64(o.TakeTTL/time.Second))
	if !b.acted {
		// The bucket's first action, sized on the one request Envoy
		// reported as it subscribed: it lasts 1s, so that the next one,
		// sized on the demand reported meanwhile, comes soon.
		z.ttl = 1
	}
	todo := ms[:0:0]
	for _, m := range ms {
		if o.Taker == nil {
			st.unenforced(m.Rule, "no decision path to take from (RLQS served without an agent)", p)
			continue
		}
		lim, ok := m.Rule.Limit(o.Region)
		if !ok {
			st.unenforced(m.Rule, "a scope: global rule with no share in this agent's region", p)
			continue
		}
		w, ok := takeWant(m.Rule, lim.Burst, demand, z.ttl, delta)
		if !ok {
			st.unenforced(m.Rule, "its burst is below the smallest assignment's cost (1 token + 1/s for 1s and the delivery margin)", p)
			continue
		}
		z = smaller(z, w)
		todo = append(todo, m)
	}
	if p.deny {
		return // a policy denies it: a take now would be paid for nothing
	}
	funded := false
	start := st.s.now()
	for _, m := range todo {
		t, err := st.takeOnce(ctx, m, z, delta)
		if err == nil {
			if next := retry(m.Rule, t, z, demand, delta); next != z {
				z = next
				t, err = st.takeOnce(ctx, m, z, delta)
			}
		}
		if err != nil {
			st.unenforced(m.Rule, "the agent refused the take: "+err.Error(), p)
			if p.deny {
				return
			}
			continue
		}
		switch t.Outcome {
		case Funded:
			funded = true
		case Open:
			p.fail = true
		case Over:
			p.deny = true
			s := int64(math.Ceil(t.RetryAfter.Seconds()))
			p.denyTTL = max(p.denyTTL, min(max(1, s), int64(o.MaxTTL/time.Second)))
		default:
			// Unavailable, or Gone: the next report matches the bucket
			// against the rules then in force. A denial for so short a
			// while errs the safe way.
			p.deny, p.retry = true, true
		}
		if p.deny {
			// The bucket is denied: a take now would be paid for nothing.
			// (Those made before it are lost, as any take's unspent part.)
			return
		}
	}
	if funded {
		p.limit = smaller(p.limit, z)
		p.funded = true
		p.takenAt = start
	}
}

// takeOnce asks the Taker for one take of assignment z for m, held for as
// long as Envoy may spend it, and counts it.
func (st *stream) takeOnce(ctx context.Context, m rules.Match, z sizes, delta int64) (Taken, error) {
	d := time.Duration(delta) * time.Microsecond
	t, err := st.s.o.Taker.Take(ctx, m.Rule, m.Subject, cost(z, delta), spendFor(z.ttl, d))
	if err != nil {
		st.s.m.takes.WithLabelValues("error").Inc()
		return t, err
	}
	st.s.m.takes.WithLabelValues(t.Outcome.String()).Inc()
	return t, nil
}

// retry is the assignment to ask for again after a take of z by rule r
// came out as t (z itself: not again). A take refused for its hold's
// length is asked again with the TTL that fits (its rate and burst kept:
// a promoted subject's lease may well hold them), or not at all when not
// even a TTL of 1s fits. A spent quota is asked for the smallest
// assignment. A local_emergency rule whose store is down is asked for
// what fits its emergency bucket (the agent's, per agent, which refuses a
// cost over its burst as unavailable), at most z.
func retry(r *rules.Rule, t Taken, z sizes, demand float64, delta int64) sizes {
	out := t.Outcome
	switch {
	case out == Over && t.Short:
		d := time.Duration(delta) * time.Microsecond
		if ttl := int64((t.Within - SendMargin - d) / time.Second); ttl >= 1 && ttl < z.ttl {
			z.ttl = ttl
		}
		return z
	case out == Over:
		return minTake
	case out == Unavailable && r.OnFailure == rules.Emergency:
		if w, ok := takeWant(r, r.Emergency.Burst, demand, z.ttl, delta); ok {
			return smaller(z, w)
		}
		return minTake
	}
	return z
}

// unenforced decides a bucket's rule r that RLQS cannot take for (why) by
// the rule's failure policy, as if its store were down for good:
// fail_open admits, any other denies. An operator must hear of it, once
// per rule: fail_open here means the rule limits nothing on Envoy.
func (st *stream) unenforced(r *rules.Rule, why string, p *plan) {
	p.fail = true
	effect := "admitted (fail_open: ALLOW_ALL)"
	if r.OnFailure != rules.FailOpen {
		p.deny, p.retry = true, true
		effect = "denied (DENY_ALL)"
	}
	st.s.warnUnenforced(r, why, effect)
}

// warnUnenforced logs, once per rule, that a bucket matched a rule RLQS
// cannot enforce, why, and what the bucket got instead.
func (s *Server) warnUnenforced(r *rules.Rule, why, effect string) {
	if _, seen := s.unenforced.LoadOrStore(r.Name, true); seen {
		return
	}
	s.o.Logger.Warn("an RLQS bucket matched a rule RLQS cannot enforce: its failure policy decides its requests; enforce the rule with Envoy's RLS filter",
		"rule", r.Name, "because", why, "requests", effect)
}
