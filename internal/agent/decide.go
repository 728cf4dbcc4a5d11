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
	// matched: Subject is a matcher's (rules.Match, as RLQS matches a
	// bucket id), not a caller's: it may be empty (a rule without a
	// wildcard key) or longer than MaxSubjectLen, as a subject matched
	// from descriptors may be.
	matched bool
	// heldFor (µs), for an RLQS take, holds its cost that long
	// (bucket.Request.HeldFor): Envoy spends it later.
	heldFor int64
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
	// fundFor is, for a held request (Request.heldFor) refused only
	// because its hold would outlast the lease that decided it, how long
	// that lease could hold one now (µs, leases' clock); 0 otherwise.
	fundFor int64
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

// heldSpender is the optional part of Leases (holder.Leases has it) that
// decides a held step (an RLQS take, bucket.Request.HeldFor) on a lease:
// its cost is lent until the hold ends, not spent, so that the lease does
// not refill behind tokens Envoy has yet to spend.
type heldSpender interface {
	SpendHeld(ctx context.Context, rule *rules.Rule, subject string, cost float64, now, heldFor, until int64) (holder.Held, bool)
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
	// fundFor: a held step refused because its hold would outlast its
	// lease (Response.fundFor).
	fundFor int64
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
	s.decideWatched(ctx, reqs, out, errs, false)
}

// decideWatched is the one entry of every decision (Allow, AllowBatch,
// the HTTP check, Envoy's ShouldRateLimit, RLQS takes): it is watched by
// the stall watchdog (/healthz) and decided by decideBatch. joint: the
// requests stand or fall together (decideBatch).
func (s *Service) decideWatched(ctx context.Context, reqs []Request, out []Response, errs []error, joint bool) {
	if w := s.watch; w != nil {
		e := w.begin()
		s.decideBatch(ctx, reqs, out, errs, 0, joint)
		w.end(e) // not deferred: a panic leaves it counted, as stuck as it is
		return
	}
	s.decideBatch(ctx, reqs, out, errs, 0, joint)
}

// decideBatch is DecideBatch; round > 0 decides again requests that found
// another attempt of themselves in flight (resolveWaiting). joint: the
// requests are one call's descriptors that stand or fall together (Envoy's
// RLS): an invalid one fails the call before any bucket is touched (its
// error in errs, the others nil), and when any is denied every charge is
// refunded and recorded as not admitted.
func (s *Service) decideBatch(ctx context.Context, reqs []Request, out []Response, errs []error, round int, joint bool) {
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
	if joint && s.failJoint(items, errs) {
		if bb != nil {
			putBatchBufs(bb)
		}
		return
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
	// final says whether each request's charges stand: for joint
	// requests, none do once any is denied (refund gives back the charges
	// of requests marked denied).
	final := out
	if joint && anyDenied(out) {
		final = make([]Response, len(out))
	}
	if s.rec != nil {
		s.rec.batch(recStart, steps, final)
	}
	s.refund(ctx, steps, final)
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

// failJoint reports whether a joint call fails: its first invalid request
// (counted once) has its error in errs, every other entry nil.
func (s *Service) failJoint(items []item, errs []error) bool {
	for i := range items {
		if items[i].err != nil {
			clear(errs)
			errs[i] = items[i].err
			s.metrics.invalid.Inc()
			return true
		}
	}
	return false
}

func anyDenied(out []Response) bool {
	for i := range out {
		if !out[i].Allowed {
			return true
		}
	}
	return false
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
		if !req.matched && (req.Subject == "" || len(req.Subject) > MaxSubjectLen) {
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
		br.Key, br.Limit, br.Cost, br.RequestID, br.HeldFor = key, limit, req.Cost, req.RequestID, req.heldFor
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
