package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/rules"
)

// Reason says why a decision came out as it did.
type Reason uint8

const (
	ReasonOK          Reason = iota + 1 // every matching rule admitted
	ReasonOverLimit                     // a rule's quota is spent: 429
	ReasonNoRule                        // nothing matched: admitted
	ReasonShadow                        // a shadow rule would have denied: admitted
	ReasonUnavailable                   // store unreachable: fail_open admitted, or fail_closed (503)
	ReasonEmergency                     // decided by the local emergency bucket
)

var reasonNames = [...]string{"unspecified", "ok", "over_limit", "no_rule", "shadow", "unavailable", "emergency"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Limits on a request, checked before any matching or I/O.
const (
	MaxSubjectLen = 256
)

// Request is one question: may this request proceed?
type Request struct {
	// Descriptors are matched against the rules. Either Descriptors or
	// Rule (with Subject) is set, not both.
	Descriptors map[string]string
	Rule        string
	Subject     string
	// Cost in tokens; 0 means 1.
	Cost float64
	// RequestID makes retries safe: a repeated id charges nothing again.
	RequestID string
	// pairs are the descriptors as the gRPC batch decoder read them (wire.go),
	// in place of Descriptors, which is then nil.
	pairs rules.Pairs
	// repeat: the batch decoder read this request from the same bytes as
	// the one before it (a batch of one hot key), and made it a copy of
	// that one; decideBatch then copies its steps instead of matching.
	repeat bool
}

// Response is the decision.
type Response struct {
	Allowed    bool
	RetryAfter time.Duration // 0 when allowed or when no wait helps
	Remaining  float64       // tokens left in the deciding rule's bucket
	Limit      float64       // the deciding rule's burst
	Rate       float64       // the deciding rule's refill rate
	Reset      time.Duration // until the deciding rule's bucket is full
	Rule       string        // the deciding rule ("" when none matched)
	Reason     Reason
}

// Store is what the agent needs of a bucket store (Redis or memory).
type Store interface {
	Take(ctx context.Context, req bucket.Request) (bucket.Result, error)
	TakeBatch(ctx context.Context, reqs []bucket.Request, out []bucket.Outcome)
	Refund(ctx context.Context, req bucket.Request) error
	Ping(ctx context.Context) error
}

// Leases spends leased budget locally (holder.Leases). Spend does no I/O
// except, once per quota, a bounded wait for its first grant; ok is false
// when the agent holds no valid lease for the quota (not granted, expired),
// and the caller then applies the rule's failure policy. now comes from Now,
// read once per batch: a clock read costs more than a leased decision.
//
// Spend reports where it took the tokens from (the subject's own lease,
// or its copy of its rule's default lease with lease.default_share, and
// which lease), and Refund gives them back there, or nowhere once that
// lease is gone.
type Leases interface {
	Now() int64
	Spend(ctx context.Context, rule *rules.Rule, subject string, cost float64, now int64) (res bucket.Result, src holder.Source, ok bool)
	Refund(src holder.Source, cost float64)
	// DownFor is how long the coordinators have been unreachable (0 while
	// they answer): the emergency policy's clock for leased rules.
	DownFor() time.Duration
}

// leasePreparer is the optional part of Leases (holder.Leases has it):
// Prepare starts acquiring a quota without waiting, so that a request's
// new leased subjects are granted together and their first decisions wait
// out one cold start in all, not one each in turn.
type leasePreparer interface {
	Prepare(rule *rules.Rule, subject string)
}

// path is where one rule of one request was decided.
type path uint8

const (
	pathNone     path = iota
	pathRedis         // the shared store (Redis, or memory under -dev)
	pathLeased        // local lease
	pathFallback      // failure policy
	// pathGone: the caller hung up (or its own deadline passed) before its
	// dependency answered. Nothing was decided and nothing is spent: no
	// failure policy, episode or emergency allowance is touched, and the
	// answer (which no one reads) is "unavailable".
	pathGone
	// pathCached: the store's last denial of the bucket, still certain
	// (denials.go): denied without a store call.
	pathCached
)

var pathNames = [...]string{"none", "store", "leased", "fallback", "gone", "cached"}

func (p path) String() string { return pathNames[p] }

// step is one matching rule of one request.
type step struct {
	rule    *rules.Rule
	subject string
	req     bucket.Request
	path    path
	res     bucket.Result
	allowed bool
	reason  Reason
	charged bool          // tokens were taken and must be refunded if the request is denied
	src     holder.Source // leased: the lease the tokens were taken from
	// limit is the bucket the rule has here (req.Limit as prepared; the
	// failure policy may point req at its emergency bucket): what the
	// admission log records.
	limit bucket.Limit
	// hot: a mode auto step decided on the lease of a promotion (hot.go);
	// the lease subject is hot.subject.
	hot  *hotKey
	item int // index of the request in its batch
	// rid is the request's id (req.RequestID may be cleared for a local
	// emergency bucket); the admission log carries it.
	rid string
	// replayed: answered from the agent's record of request ids (or a
	// duplicate within the batch); nothing is charged.
	replayed bool
	// skip: not decided in this pass (another attempt of the same request
	// is in flight; see resolveWaiting).
	skip bool
	// never: a shadow rule that could never admit the request as sent
	// (neverAdmits); denied, and never charged.
	never bool
	// node: the store node that decides the step's key (set when it goes
	// to the store): its breaker, its outage episode.
	node *storeNode
	// probe: the lapsed local denial this step asks the store about for
	// every request of its bucket (denials.go); released once answered.
	probe *denial
}

// item is one request of a batch while it is being decided.
type item struct {
	first, n int // its steps: steps[first : first+n]
	err      error
}

// Decide answers one request. Errors wrap ErrInvalidRequest (the request can
// never succeed as sent); store trouble is not an error but a decision made
// by the rule's failure policy.
func (s *Service) Decide(ctx context.Context, req Request) (Response, error) {
	var out [1]Response
	var errs [1]error
	s.DecideBatch(ctx, []Request{req}, out[:], errs[:])
	return out[0], errs[0]
}

// DecideBatch answers many independent requests; their Redis charges go out
// pipelined, in store calls of at most storeChunk (chargeStoreBatch). out
// and errs must be as long as reqs.
func (s *Service) DecideBatch(ctx context.Context, reqs []Request, out []Response, errs []error) {
	if w := s.watch; w != nil {
		e := w.begin()
		s.decideBatch(ctx, reqs, out, errs, 0)
		w.end(e) // not deferred: a panic leaves it counted, as stuck as it is
		return
	}
	s.decideBatch(ctx, reqs, out, errs, 0)
}

// decideBatch is DecideBatch; round > 0 decides again requests that found
// another attempt of themselves in flight (resolveWaiting).
func (s *Service) decideBatch(ctx context.Context, reqs []Request, out []Response, errs []error, round int) {
	// One clock read starts the batch. With leases it is theirs (a
	// monotonic reading, in microseconds), which is also the now of the
	// batch's leased spends: a leased decision reads the clock once here
	// and once at the end, for its duration, and nowhere else. Without
	// leases it is time.Now.
	var start time.Time
	var leaseStart int64
	if s.leases != nil {
		leaseStart = s.leases.Now()
	} else {
		start = time.Now()
	}
	var recStart int64
	if s.rec != nil {
		recStart = monoNow()
	}
	set := s.rules.Current()
	// A lone request (unary Allow, Envoy's ShouldRateLimit, an HTTP check)
	// is decided in buffers on this stack: made, these slices would be
	// three allocations of every such decision. Steps past two (a request
	// matching three rules or more) grow onto the heap as before.
	var itemBuf [1]item
	var stepBuf [2]step
	var matchBuf [2]rules.Match
	var items []item
	var steps []step
	var bb *batchBufs // a batch's pooled buffers, given back at the end
	if len(reqs) == 1 {
		items, steps = itemBuf[:], stepBuf[:0]
	} else {
		// A batch's buffers are reused: made for each batch, a thousand
		// steps were a quarter of a megabyte to zero and for the GC to scan.
		bb = getBatchBufs(len(reqs))
		items, steps = bb.items, bb.steps
	}
	matches := matchBuf[:0]
	withID := false
	for i := range reqs {
		items[i].first = len(steps)
		if i > 0 && sameQuestion(&reqs[i], &reqs[i-1]) {
			// The previous request's answer to match and prepare, without
			// asking again: a batch of one hot key is mostly this.
			if reqs[i].Cost == 0 {
				reqs[i].Cost = 1 // as match does
			}
			steps = s.repeatSteps(steps, &items[i-1], &items[i], i)
			continue
		}
		var err error
		matches, err = s.match(set, &reqs[i], matches[:0])
		if err == nil {
			steps, err = s.prepare(set, steps, matches, &reqs[i], i)
		}
		if err != nil {
			steps = steps[:items[i].first]
			items[i].err = err
			continue
		}
		items[i].n = len(steps) - items[i].first
		withID = withID || (reqs[i].RequestID != "" && items[i].n > 0)
	}

	// Requests with an id consult the agent's record first (replay.go);
	// the others never touch it.
	var cs *claims
	if withID && s.ids != nil {
		if start.IsZero() {
			start = time.Now()
		}
		cs = s.ids.claimBatch(s.ids.now(start), reqs, items, steps)
	}

	s.charge(ctx, steps, leaseStart)

	for i := range items {
		it := &items[i]
		errs[i] = it.err
		if it.err != nil {
			out[i] = Response{}
			s.metrics.invalid.Inc()
			continue
		}
		if cs != nil {
			switch c := &cs.c[i]; c.kind {
			case claimReplay:
				out[i] = c.resp
				continue
			case claimDup, claimWait:
				continue // below, and in resolveWaiting
			}
		}
		s.combine(&out[i], steps[it.first:it.first+it.n])
	}
	if cs != nil {
		for i := range cs.c {
			if c := &cs.c[i]; c.kind == claimDup {
				out[i] = out[c.dup]
			}
		}
	}
	if s.rec != nil {
		s.rec.batch(recStart, steps, out)
	}
	s.refund(ctx, steps, out)
	if cs != nil {
		s.ids.settle(cs, items, steps, out)
	}
	var d time.Duration
	if s.leases != nil {
		d = time.Duration(s.leases.Now()-leaseStart) * time.Microsecond
	} else {
		d = time.Since(start)
	}
	s.observe(steps, out, errs, d)
	if cs != nil && cs.waiting > 0 {
		s.resolveWaiting(ctx, cs, reqs, items, steps, out, errs, round)
	}
	// Not deferred, and steps not kept (bb keeps the array it gave, even if
	// steps outgrew it): a closure over steps, or steps stored in bb, would
	// move a lone request's stack buffers to the heap (two allocations
	// and 528 bytes per unary decision).
	if bb != nil {
		putBatchBufs(bb)
	}
}

// sameQuestion reports whether r asks what prev (the request before it in
// its batch, already matched) asked, so that prev's steps are r's: the
// same bytes on the wire, or the same rule, subject and cost. A request
// id or a descriptors map (a caller's; maps are not compared) is never
// taken for the same.
func sameQuestion(r, prev *Request) bool {
	if r.RequestID != "" || r.Descriptors != nil {
		return false
	}
	if r.repeat {
		return true
	}
	return r.pairs == nil && prev.pairs == nil && prev.Descriptors == nil && prev.RequestID == "" &&
		r.Rule != "" && r.Rule == prev.Rule && r.Subject == prev.Subject && (r.Cost == prev.Cost || r.Cost == 0 && prev.Cost == 1)
}

// repeatSteps gives item (request i) a copy of prev's steps, or its error.
func (s *Service) repeatSteps(steps []step, prev, item *item, i int) []step {
	if prev.err != nil {
		item.err, item.n = prev.err, 0
		return steps
	}
	for j := prev.first; j < prev.first+prev.n; j++ {
		steps = append(steps, steps[j])
		steps[len(steps)-1].item = i
	}
	item.n = prev.n
	return steps
}

// batchBufs are decideBatch's buffers for a batch of more than one request.
type batchBufs struct {
	items []item
	steps []step
}

var batchPool sync.Pool // of *batchBufs

// getBatchBufs returns n zeroed items and room for n steps. The steps are
// not zeroed: prepare appends each as a zero step before filling it.
func getBatchBufs(n int) *batchBufs {
	bb, _ := batchPool.Get().(*batchBufs)
	if bb == nil {
		bb = &batchBufs{}
	}
	bb.items = room(bb.items, n)[:n]
	clear(bb.items)
	bb.steps = room(bb.steps, n)
	return bb
}

// room returns s emptied, with room for n elements: s's own array when it
// has it (the pooled buffers of a batch), a new one otherwise.
func room[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, 0, n)
	}
	return s[:0]
}

// putBatchBufs keeps bb for the next batch. What its steps point to stays
// reachable until they are written over or the pool drops them at a
// garbage collection.
func putBatchBufs(bb *batchBufs) {
	if cap(bb.steps) > 4*MaxBatch {
		return
	}
	batchPool.Put(bb)
}

// match finds the rules a request is subject to, validating it first.
func (s *Service) match(set *rules.Set, req *Request, buf []rules.Match) ([]rules.Match, error) {
	if req.Cost == 0 {
		req.Cost = 1
	}
	if math.IsNaN(req.Cost) || math.IsInf(req.Cost, 0) || req.Cost < 0 || req.Cost > bucket.MaxValue {
		return nil, fmt.Errorf("%w: cost %v must be a positive number no larger than %g", ErrInvalidRequest, req.Cost, float64(bucket.MaxValue))
	}
	if err := bucket.ValidateRequestID(req.RequestID); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if req.Rule != "" || req.Subject != "" {
		if len(req.Descriptors) > 0 || len(req.pairs) > 0 {
			return nil, fmt.Errorf("%w: give descriptors or rule and subject, not both", ErrInvalidRequest)
		}
		if req.Rule == "" {
			return nil, fmt.Errorf("%w: subject %q given without a rule", ErrInvalidRequest, truncate(req.Subject))
		}
		if req.Subject == "" || len(req.Subject) > MaxSubjectLen {
			return nil, fmt.Errorf("%w: subject must be 1 to %d bytes, got %d", ErrInvalidRequest, MaxSubjectLen, len(req.Subject))
		}
		if req.Subject == rules.DefaultSubject {
			// It names a default-share rule's default quota, every
			// subject's at once; refused for every rule, so that the answer
			// does not change with a reload of the rule's mode.
			return nil, fmt.Errorf("%w: subject %q is reserved (it names a rule's default quota); give the subject's descriptors or another subject", ErrInvalidRequest, rules.DefaultSubject)
		}
		r, ok := set.Rule(req.Rule)
		if !ok {
			return nil, fmt.Errorf("%w: %w %q", ErrInvalidRequest, ErrUnknownRule, truncate(req.Rule))
		}
		return append(buf, rules.Match{Rule: r, Subject: req.Subject}), nil
	}
	if req.pairs != nil {
		if err := rules.ValidatePairs(req.pairs); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		return set.MatchPairs(req.pairs, buf), nil
	}
	if err := rules.ValidateDescriptors(req.Descriptors); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return set.Match(req.Descriptors, buf), nil
}

// prepare turns matches into steps, validating every charge before any I/O
// so that a request that cannot succeed touches no bucket.
func (s *Service) prepare(set *rules.Set, steps []step, matches []rules.Match, req *Request, idx int) ([]step, error) {
	for _, m := range matches {
		// A scope: global redis rule's bucket in this region is the
		// region's weighted share.
		limit, shared := m.Rule.Limit(s.cfg.Region)
		key := m.Key // made with the subject, when the match made it
		// A leased rule's bucket key is made only if a path needs it (the
		// record of request ids, an emergency bucket: step.key): spent on
		// its lease, the decision never uses it.
		lazyKey := key == "" && m.Rule.Mode == rules.ModeLeased
		if key == "" && !lazyKey {
			key = bucket.Key(m.Rule.Name, m.Subject)
		}
		// The step is built in place: a step is large, and copying one in
		// costs a leased decision more than its validation.
		steps = append(steps, step{})
		st := &steps[len(steps)-1]
		st.rule, st.subject, st.item, st.rid = m.Rule, m.Subject, idx, req.RequestID
		br := &st.req
		br.Key, br.Limit, br.Cost, br.RequestID = key, limit, req.Cost, req.RequestID
		if err := s.checkStep(m, br, shared, lazyKey); err != nil {
			if !m.Rule.Shadow {
				return steps[:len(steps)-1], err
			}
			neverAdmits(st)
			continue
		}
		if m.Rule.Mode == rules.ModeAuto {
			s.prepareAuto(set, m, br)
		}
		st.limit = br.Limit
	}
	return steps, nil
}

// pendingKey stands for a leased step's bucket key, made later if at all,
// while its request is validated.
const pendingKey = "pending"

// key is the step's bucket key, made now if prepare left it to be made
// (a leased rule's).
func (st *step) key() string {
	if st.req.Key == "" {
		st.req.Key = bucket.Key(st.rule.Name, st.subject)
	}
	return st.req.Key
}

// prepareAuto makes br a hot-key request (bucket.Request.Hot) for a mode
// auto rule's subject: its own bucket key (the plain script never touches
// it, so a rule that changes mode starts afresh), no request id in the
// store (the agent's own record answers replays). A subject whose
// promotion's quota name would be too long for the coordinator, or is not
// UTF-8, stays a plain Redis subject: every agent makes the same choice
// from the same rule, so its key never sees the hot-key script.
func (s *Service) prepareAuto(set *rules.Set, m rules.Match, br *bucket.Request) {
	const epochLen = 1 + 19 // "@" and the digits of an int64
	if len(m.Rule.Name)+1+len(m.Subject)+epochLen > lease.MaxNameLen || !utf8.ValidString(m.Subject) {
		return
	}
	br.Key = bucket.HotKey(m.Rule.Name, m.Subject)
	br.RequestID = ""
	br.Hot = s.hot.hot(set, m.Rule)
}

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
				if st.rule == run.rule && st.subject == run.subject {
					if allowed, remaining, reset, retry, src, ok := run.ref.SpendFrom(st.req.Cost, leaseNow); ok {
						st.res = bucket.Result{Allowed: allowed, Remaining: remaining, Reset: reset, RetryAfter: retry}
						st.src = src
						st.path, st.allowed, st.charged, st.reason = pathLeased, allowed, allowed, verdict(allowed)
						continue
					}
				}
				res, src, ok := s.leases.Spend(ctx, st.rule, st.subject, st.req.Cost, leaseNow)
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

// spendHot decides st on the lease of its promotion k.
func (s *Service) spendHot(ctx context.Context, st *step, k *hotKey, now int64) {
	st.hot = k
	if res, src, ok := s.leases.Spend(ctx, st.rule, k.subject, st.req.Cost, now); ok {
		st.path, st.res, st.allowed, st.charged = pathLeased, res, res.Allowed, res.Allowed
		st.src = src
		st.reason = verdict(res.Allowed)
		k.count.Add(1)
		return
	}
	st.path = pathFallback
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

// respond makes dst the answer of st with allowed and r.
func respond(dst *Response, st *step, allowed bool, r Reason) {
	dst.Allowed, dst.Reason, dst.RetryAfter = allowed, r, 0
	dst.Remaining, dst.Limit, dst.Rate, dst.Reset = st.res.Remaining, st.req.Limit.Burst, st.req.Limit.Rate, st.res.Reset
	dst.Rule = st.rule.Name
	if !allowed {
		dst.RetryAfter = st.res.RetryAfter
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

func storeErrorKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, bucket.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, bucket.ErrAuth):
		return "auth"
	default:
		return "other"
	}
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
