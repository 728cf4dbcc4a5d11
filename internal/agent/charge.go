package agent

// Charging a request's steps: leased ones from the agent's leases, store
// ones in one round trip per batch, the rest by the failure policy.

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
)

// charge decides every step: leased ones locally, store ones in one round
// trip (unless the breaker says the store is down), the rest by policy.
// leaseNow is the leases' clock at the batch's start (0: not read).
func (s *Service) charge(ctx context.Context, steps []step, leaseNow int64) {
	nStore := 0
	hotStore := false // a mode auto step goes to the store: it may report a promotion
	var run struct {
		rule    *rules.Rule
		subject string
		ref     holder.Ref // the zero Ref (of a default-share rule) spends nothing
	}
	s.prepareLeases(steps)
	for i := range steps {
		st := &steps[i]
		if st.replayed || st.skip || st.never {
			continue // path stays pathNone: nothing is charged
		}
		if st.req.Hot != nil {
			if s.leases != nil {
				if leaseNow == 0 {
					leaseNow = s.leases.Now()
				}
				if k := s.hot.spendable(st.req.Key, leaseNow); k != nil {
					s.spendHot(ctx, st, k, leaseNow)
					// The spend may have waited for the promotion's first
					// grant: what comes after is checked at the time now.
					leaseNow = s.leases.Now()
					continue
				}
			}
			hotStore = true
		}
		if st.rule.Mode == rules.ModeLeased {
			if s.leases != nil {
				if leaseNow == 0 {
					leaseNow = s.leases.Now()
				}
				// A run of steps of one quota (a batch of one hot key)
				// spends through the Ref the run's first step took.
				if st.rule == run.rule && st.subject == run.subject && st.req.HeldFor == 0 {
					if allowed, remaining, reset, retry, src, ok := run.ref.SpendFrom(st.req.Cost, leaseNow); ok {
						st.res = bucket.Result{Allowed: allowed, Remaining: remaining, Reset: reset, RetryAfter: retry}
						st.src = src
						st.path, st.allowed, st.charged, st.reason = pathLeased, allowed, allowed, verdict(allowed)
						continue
					}
				}
				res, src, ok := s.spendLease(ctx, st, st.subject, leaseNow, math.MaxInt64)
				// A Spend may wait for a new quota's first grant (up to the
				// decision timeout): the steps after it are checked against
				// the clock after the wait, or they would spend leases that
				// expired meanwhile, and mark hot keys that lapsed, as if
				// still valid. The Ref path above never waits.
				leaseNow = s.leases.Now()
				if ok {
					st.path, st.res, st.allowed, st.charged = pathLeased, res, res.Allowed, res.Allowed
					st.src = src
					st.reason = verdict(res.Allowed)
					if s.refs != nil && i+1 < len(steps) && steps[i+1].rule == st.rule && steps[i+1].subject == st.subject {
						run.rule, run.subject, run.ref = st.rule, st.subject, s.refs.Ref(st.rule, st.subject)
					}
					continue
				}
			}
			st.path = pathFallback
			continue
		}
		st.path = pathRedis
		nStore++
	}
	if nStore > 0 {
		s.chargeStore(ctx, steps, nStore)
		// leaseNow was read before the store call: a promotion's mark is
		// counted from it, as from a send.
		if hotStore {
			if wait, again := s.adoptPromotions(ctx, steps, leaseNow, nil); len(again) > 0 {
				s.decideAfterLapse(ctx, steps, again, wait)
			}
		}
	}
	var now time.Time
	for i := range steps {
		st := &steps[i]
		if st.path != pathFallback {
			continue
		}
		if ctx.Err() != nil {
			// The caller hung up before the dependency answered (a store
			// call, a first-grant wait): nothing was decided, and no
			// policy is touched for an answer no one reads.
			st.path, st.allowed, st.reason = pathGone, false, ReasonUnavailable
			continue
		}
		if now.IsZero() {
			now = time.Now()
		}
		// An emergency allowance is measured from the start of the outage
		// of the dependency this rule uses: the coordinators, or the store
		// node its bucket is on.
		var down time.Duration
		leased := st.rule.Mode == rules.ModeLeased || st.hot != nil
		switch {
		case leased:
			if s.leases != nil {
				down = s.leases.DownFor()
			}
		default:
			if st.node == nil {
				st.node = s.nodes.of(ctx, st.key())
			}
			down = st.node.since(now)
		}
		if s.fallback.decide(ctx, st, down, leased, now) {
			s.logActivation(st)
		}
	}
}

// spendHot decides st on the lease of its promotion k. A held step's
// hold must end before the mark seen last lapses: the store's bucket
// resumes empty then, as if nothing of the leased phase were still to be
// spent.
func (s *Service) spendHot(ctx context.Context, st *step, k *hotKey, now int64) {
	st.hot = k
	if res, src, ok := s.spendLease(ctx, st, k.subject, now, k.until.Load()); ok {
		st.path, st.res, st.allowed, st.charged = pathLeased, res, res.Allowed, res.Allowed
		st.src = src
		st.reason = verdict(res.Allowed)
		if st.fundFor == 0 {
			k.count.Add(1)
		}
		return
	}
	st.path = pathFallback
}

// spendLease spends st's cost from the lease of (st.rule, subject) at
// now. A held step (an RLQS take: Envoy spends its tokens later) is lent
// instead, until its hold ends, which must be by until (leases' clock) and
// while the lease may be spent; one that would outlast either is refused
// (denied, nothing charged, st.fundFor set). Its tokens are never
// refunded: they are Envoy's.
func (s *Service) spendLease(ctx context.Context, st *step, subject string, now, until int64) (bucket.Result, holder.Source, bool) {
	if st.req.HeldFor == 0 {
		return s.leases.Spend(ctx, st.rule, subject, st.req.Cost, now)
	}
	hs, ok := s.leases.(heldSpender)
	if !ok {
		// Leases that cannot lend would let their balance refill behind
		// Envoy's tokens: the take is refused, and charged nowhere.
		return bucket.Result{}, holder.Source{}, true
	}
	h, ok := hs.SpendHeld(ctx, st.rule, subject, st.req.Cost, now, st.req.HeldFor, until)
	if h.Short {
		st.fundFor = max(1, h.Fund)
	}
	return h.Result, holder.Source{}, ok
}

// adoptPromotions follows the promotions the store reported: a step the
// store answered "leased" is decided now on the promotion's lease; a step
// whose decision promoted its subject stands, and the subject's next
// decisions go to the lease. sentAt is the leases' clock read before the
// store call.
//
// A "leased" answer whose mark ends too soon to spend under (within the
// pause allowance: a promotion that is being let go) cannot be decided on
// the lease, nor on the store until the mark lapses. With retry, such
// steps are left on pathRedis for the caller to decide again once the
// longest of those marks is over (wait; n is how many); without, they fall
// to the failure policy.
func (s *Service) adoptPromotions(ctx context.Context, steps []step, sentAt int64, only []int) (wait time.Duration, again []int) {
	retry := only == nil
	for j := range steps {
		i := j
		if !retry {
			if j >= len(only) {
				break
			}
			i = only[j]
		}
		st := &steps[i]
		if st.path != pathRedis || st.req.Hot == nil || st.res.Promotion.Epoch == 0 {
			continue
		}
		leased := st.res.Leased
		var k *hotKey
		if s.leases != nil {
			k = s.hot.adopt(st, st.res.Promotion, sentAt)
		}
		if !leased {
			continue
		}
		p := st.res.Promotion
		st.res, st.allowed, st.charged, st.reason = bucket.Result{}, false, false, 0
		if k == nil && s.leases != nil && retry && p.For <= 2*hotPause.Microseconds() {
			wait = max(wait, time.Duration(p.For+1000)*time.Microsecond)
			again = append(again, i)
			continue
		}
		if k == nil {
			st.path = pathFallback // no leases here, or no room for one more hot subject
			st.hot = &hotKey{}     // the failure policy's clock is the leases'
			continue
		}
		s.spendHot(ctx, st, k, s.leases.Now())
	}
	return wait, again
}

// decideAfterLapse decides steps[again] in the store again once wait (the
// rest of their marks, at most 2*hotPause) has passed: by then the store
// decides them, or has promoted them anew.
func (s *Service) decideAfterLapse(ctx context.Context, steps []step, again []int, wait time.Duration) {
	t := time.NewTimer(wait)
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()
	sentAt := s.leases.Now()
	// As a batch's first store calls: a batch of one hot subject may have
	// thousands of such steps, too many for one decision timeout one by one.
	s.storeSteps(ctx, steps, again)
	s.adoptPromotions(ctx, steps, sentAt, again)
}

// prepareLeases starts acquiring every leased quota of steps before the
// first is decided, when there are several: a batch of new subjects then
// waits for one round of grants, not for each subject's grant in turn.
func (s *Service) prepareLeases(steps []step) {
	p := s.preparer
	if p == nil {
		return
	}
	n := 0
	for i := range steps {
		if st := &steps[i]; st.rule.Mode == rules.ModeLeased && !st.replayed && !st.skip && !st.never {
			if n++; n > 1 {
				break
			}
		}
	}
	if n < 2 {
		return
	}
	var last *step
	for i := range steps {
		if st := &steps[i]; st.rule.Mode == rules.ModeLeased && !st.replayed && !st.skip && !st.never {
			// A batch often holds runs of one hot subject: Prepare is a
			// lookup that changes nothing for a quota already prepared.
			if last != nil && last.rule == st.rule && last.subject == st.subject {
				continue
			}
			p.Prepare(st.rule, st.subject)
			last = st
		}
	}
}

func (s *Service) chargeStore(ctx context.Context, steps []step, n int) {
	n = s.route(ctx, steps)
	if s.denials != nil {
		defer probed(steps)
	}
	if n == 0 {
		return
	}
	if n > 1 {
		s.chargeStoreBatch(ctx, steps, n)
		return
	}
	caller := ctx
	ctx, cancel := s.bound(ctx)
	defer cancel()
	for i := range steps {
		if st := &steps[i]; st.path == pathRedis {
			var sent int64
			if s.denials != nil {
				sent = sinceStart()
			}
			res, err := s.store.Take(ctx, st.req)
			s.storeResult(caller, st, res, err, time.Now(), sent)
			return
		}
	}
}

// route gives each store step its node; a step whose node's breaker is
// open falls to its rule's policy without waiting. A step the store's last
// denial of its bucket still decides (denials.go) is denied here, whatever
// its node's state: the quota is spent either way. It returns how many
// steps still go to the store.
func (s *Service) route(ctx context.Context, steps []step) int {
	n := 0
	for i := range steps {
		st := &steps[i]
		if st.path != pathRedis {
			continue
		}
		if s.denials != nil && s.denials.denyLocally(ctx, st, steps[:i]) {
			continue
		}
		st.node = s.nodes.of(ctx, st.req.Key)
		st.node.awaitRound(ctx)
		if !st.node.br.Allow() {
			s.metrics.breakerShortCircuits.Inc()
			st.path = pathFallback
			continue
		}
		n++
	}
	return n
}

// bound gives a decision's store calls their deadline: ctx limited to the
// decision timeout from now. A caller whose own deadline comes sooner
// keeps its context as it is. That is equivalent to what WithTimeout would
// return: WithTimeout reads the clock after the time.Now here, so its
// deadline would be at least as late, and a parent whose deadline comes
// first gets WithCancel(parent), a context with the caller's deadline, done
// when the caller's context is done (its deadline passing, or the caller
// hanging up), with the caller's error. Its cancel function, called once
// the store has answered, stops nothing: Take, TakeBatch and Refund return
// only when their commands are done or abandoned (go-redis's automatic
// pipeliner does not cancel a queued command by its context). What the
// shortcut saves is that context's allocations (the context, its Done
// channel, its cancel function and its entry in the caller's map of
// children: three or four per decision) and the locking of the caller's
// context to add and remove it. A gRPC caller's grpc-timeout and Envoy's
// rate-limit service timeout (20ms by default, against -decision-timeout's
// 50ms) are such deadlines.
//
// A caller without an earlier deadline still gets a timer: the go-redis
// client's own timeouts (OpenRedis sets its read, write, dial and pool
// timeouts to the decision timeout) would not bound the decision, since a
// command can wait its turn in the automatic pipeliner, then for a
// connection, then for its write and its read, each up to the timeout, and
// go-redis retries a command that failed on the network.
func (s *Service) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok && d.Before(time.Now().Add(s.cfg.DecisionTimeout)) {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, s.cfg.DecisionTimeout)
}

func noCancel() {}

// storeResult adopts the store's answer for st. caller is the request's own
// context: a store call cut short because the caller hung up (or its own
// deadline passed first) says nothing about the store, so it neither
// counts against its node's circuit breaker nor starts its outage.
func (s *Service) storeResult(caller context.Context, st *step, res bucket.Result, err error, now time.Time, sent int64) {
	switch s.adoptStore(caller, st, res, err, sent) {
	case storeFailed:
		s.nodes.failure(st.node, now, err)
	case storeAnswered:
		s.nodes.success(st.node, now)
	}
}

// storeHealth is what one store answer says of the store.
type storeHealth uint8

const (
	storeSilent   storeHealth = iota // nothing: the caller hung up first
	storeAnswered                    // the store answered
	storeFailed                      // the store did not answer in time, or failed
)

// adoptStore makes the store's answer (res, or err) to the call sent at
// sent (sinceStart) st's, and says what it tells of the store; storeResult and
// chargeStoreBatch count that once per store call. An answer that leaves the bucket short of the
// request's cost is remembered (denials.go).
func (s *Service) adoptStore(caller context.Context, st *step, res bucket.Result, err error, sent int64) storeHealth {
	if err != nil && caller.Err() != nil {
		s.metrics.storeErrors.WithLabelValues("caller_gone").Inc()
		st.path = pathFallback // pathGone in charge's last loop: the caller is gone
		return storeSilent
	}
	if err != nil {
		// Validation happened before I/O, so any error here is the store's:
		// the outcome is uncertain and the rule's policy decides.
		// An outage and refused credentials are logged once an episode
		// (storeNodes.failure), not once a decision.
		if !errors.Is(err, bucket.ErrUnavailable) && !errors.Is(err, bucket.ErrAuth) {
			s.logger.Error("unexpected store error", "rule", st.rule.Name, "err", err)
		}
		s.metrics.storeErrors.WithLabelValues(storeErrorKind(err)).Inc()
		st.path = pathFallback
		return storeFailed
	}
	st.res, st.allowed = res, res.Allowed
	st.reason = verdict(res.Allowed)
	s.denials.record(st, res, sent)
	// A replayed admission was charged by the first attempt; refunding it
	// (with its id) is still right if this attempt ends denied.
	st.charged = res.Allowed
	return storeAnswered
}
