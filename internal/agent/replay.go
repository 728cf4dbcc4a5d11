package agent

import (
	"context"
	"hash/maphash"
	"sync"
	"time"
)

// requestRecord is this agent's memory of the decisions it made for
// requests carrying a request_id, so that a retry through the same agent
// returns the recorded answer and charges nothing, on every path.
//
// Redis keeps its own record (the Lua script, per bucket, shared by every
// agent), so a request decided on the Redis path alone is not kept here.
// A request with any other step (a leased rule, or a failure policy:
// emergency, fail_open) is kept: those charges are local, and only this
// agent can know they were made. The record is per agent: a retry through
// another agent is decided again there (its Redis steps replay from Redis;
// its leased and policy steps charge again).
//
// The key is the request id and the buckets the request charges (a hash of
// the id and every step's bucket key, 64 bits: a collision needs the same
// id for different buckets and 2^-64 luck). One entry answers the whole
// request, so a request matching a Redis rule and a leased rule replays
// both verdicts together and its combined answer cannot change.
//
// Memory is bounded: entries live for ttl (the Redis record's TTL by
// default) and each of the recordShards shards keeps at most max/shards of
// them, dropping the oldest first. A request without an id never touches
// the record.
//
// Concurrency: the first attempt claims the entry before it charges
// anything; a duplicate that arrives while the claim is open waits for it
// (bounded), then replays. A duplicate inside the same batch copies the
// first one's answer.
type requestRecord struct {
	ttl      time.Duration
	perShard int
	maxWait  time.Duration
	origin   time.Time
	seed     maphash.Seed
	shards   [recordShards]recordShard
}

// recordShards is how many independently locked parts the record has.
const recordShards = 64

// DefaultRequestRecords bounds how many requests an agent remembers.
const DefaultRequestRecords = 1 << 16

type recordShard struct {
	mu   sync.Mutex
	m    map[recordKey]*recordEntry
	fifo []*recordEntry // insertion order, which is expiry order; may hold dropped entries
	head int            // fifo[:head] are gone
	live int            // entries in m
}

type recordKey struct {
	id string
	h  uint64 // the id and the request's bucket keys
}

type recordEntry struct {
	key      recordKey
	owner    *claims       // the batch deciding it; nil once decided
	item     int           // its item in that batch
	waitc    chan struct{} // made by the first waiter, closed when decided
	resp     Response
	done     bool
	gone     bool  // no longer in the map (dropped, evicted or expired)
	expireAt int64 // ns since origin
}

func newRequestRecord(limit int, ttl, maxWait time.Duration) *requestRecord {
	r := &requestRecord{
		ttl:      ttl,
		perShard: max(1, limit/recordShards),
		maxWait:  maxWait,
		origin:   time.Now(),
		seed:     maphash.MakeSeed(),
	}
	for i := range r.shards {
		r.shards[i].m = map[recordKey]*recordEntry{}
	}
	return r
}

// claimKind is what the record says about one request of a batch.
type claimKind uint8

const (
	claimNone   claimKind = iota // no id (or no rule): decided as usual, not recorded
	claimFresh                   // this batch decides it and records the answer
	claimReplay                  // answered from the record: nothing is charged
	claimDup                     // the same request as an earlier item of this batch
	claimWait                    // another batch is deciding it: wait, then look again
)

type claim struct {
	kind claimKind
	e    *recordEntry
	dup  int      // claimDup: the item whose answer this one copies
	resp Response // claimReplay
}

// claims is one batch's view of the record; its address owns the entries
// the batch claims.
type claims struct {
	c       []claim
	waiting int
}

func (r *requestRecord) now(t time.Time) int64 { return int64(t.Sub(r.origin)) }

func (r *requestRecord) key(id string, steps []step) (recordKey, *recordShard) {
	var h maphash.Hash
	h.SetSeed(r.seed)
	h.WriteString(id)
	for i := range steps {
		h.WriteByte(0)
		h.WriteString(steps[i].key())
	}
	k := recordKey{id: id, h: h.Sum64()}
	return k, &r.shards[k.h%recordShards]
}

// claimBatch looks up every request of a batch that has an id and charges
// something, and marks the steps that must not be charged in this pass.
func (r *requestRecord) claimBatch(now int64, reqs []Request, items []item, steps []step) *claims {
	cs := &claims{c: make([]claim, len(items))}
	for i := range items {
		it := &items[i]
		if it.err != nil || it.n == 0 || reqs[i].RequestID == "" {
			continue
		}
		own := steps[it.first : it.first+it.n]
		c := r.claim(now, cs, i, reqs[i].RequestID, own)
		cs.c[i] = c
		switch c.kind {
		case claimReplay, claimDup:
			for j := range own {
				own[j].replayed = true
			}
		case claimWait:
			cs.waiting++
			for j := range own {
				own[j].skip = true
			}
		}
	}
	return cs
}

func (r *requestRecord) claim(now int64, owner *claims, idx int, id string, steps []step) claim {
	k, sh := r.key(id, steps)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[k]
	if e != nil && e.done && e.expireAt <= now {
		sh.drop(e)
		e = nil
	}
	switch {
	case e == nil:
		e = &recordEntry{key: k, owner: owner, item: idx, expireAt: now + int64(r.ttl)}
		sh.m[k] = e
		sh.live++
		sh.push(e, now, r.perShard)
		return claim{kind: claimFresh, e: e}
	case !e.done && e.owner == owner:
		return claim{kind: claimDup, dup: e.item}
	case !e.done:
		if e.waitc == nil {
			e.waitc = make(chan struct{})
		}
		return claim{kind: claimWait, e: e}
	default:
		return claim{kind: claimReplay, resp: e.resp}
	}
}

// push appends e and drops, oldest first, what has expired or is over the
// shard's bound.
func (sh *recordShard) push(e *recordEntry, now int64, max int) {
	sh.fifo = append(sh.fifo, e)
	for sh.head < len(sh.fifo) {
		f := sh.fifo[sh.head]
		switch {
		case f.gone:
		case sh.live > max, f.done && f.expireAt <= now:
			sh.drop(f)
		default:
			goto trimmed
		}
		sh.fifo[sh.head] = nil
		sh.head++
	}
trimmed:
	// Dropped entries behind a live head would let the queue grow without
	// bound under traffic that is never kept: compact once it holds twice
	// the bound (amortised O(1) per push).
	if n := len(sh.fifo) - sh.head; n > 2*max+16 || (sh.head > 64 && sh.head > len(sh.fifo)/2) {
		kept := sh.fifo[:0]
		for _, f := range sh.fifo[sh.head:] {
			if !f.gone {
				kept = append(kept, f)
			}
		}
		clear(sh.fifo[len(kept):])
		sh.fifo, sh.head = kept, 0
	}
}

func (sh *recordShard) drop(e *recordEntry) {
	if e.gone {
		return
	}
	e.gone = true
	if sh.m[e.key] == e {
		delete(sh.m, e.key)
		sh.live--
	}
}

// finish records the answer of a claimed request (keep), or forgets the
// claim (a request decided by Redis alone, or not decided at all), and
// wakes its waiters.
func (r *requestRecord) finish(e *recordEntry, resp Response, keep bool) {
	sh := &r.shards[e.key.h%recordShards]
	sh.mu.Lock()
	e.owner, e.done, e.resp = nil, true, resp
	if !keep {
		sh.drop(e)
	}
	if e.waitc != nil {
		close(e.waitc)
	}
	sh.mu.Unlock()
}

// wait blocks until e is decided or ctx ends.
func (r *requestRecord) wait(ctx context.Context, e *recordEntry) {
	select {
	case <-e.waitc:
	case <-ctx.Done():
	}
}

// keepAnswer says whether a decided request goes into the record: when a
// step was decided off the Redis path (Redis records its own), and the
// answer is a decision (an unavailable denial decided nothing: a retry
// must be decided afresh).
func keepAnswer(steps []step, resp Response) bool {
	if !resp.Allowed && resp.Reason == ReasonUnavailable {
		return false
	}
	for i := range steps {
		if steps[i].path == pathLeased || steps[i].path == pathFallback {
			return true
		}
	}
	return false
}

// settle ends a batch's claims: the answers are recorded (or the claims
// dropped) once every charge and refund of the batch is done.
func (r *requestRecord) settle(cs *claims, items []item, steps []step, out []Response) {
	for i := range cs.c {
		c := &cs.c[i]
		if c.kind != claimFresh {
			continue
		}
		it := &items[i]
		r.finish(c.e, out[i], keepAnswer(steps[it.first:it.first+it.n], out[i]))
	}
}

// inFlight answers a duplicate whose first attempt was still being decided
// after the wait: nothing charged, retry shortly (as for an unreachable
// store).
func inFlight(steps []step) Response {
	resp := Response{Reason: ReasonUnavailable}
	if len(steps) > 0 {
		resp.Rule = steps[0].rule.Name
	}
	return resp
}

// resolveWaiting decides, after the batch's own claims are settled, the
// requests that found another attempt in flight: it waits for those
// attempts (never while holding a claim of its own, so two batches cannot
// wait on each other), then decides the requests again, which replays them
// from the record (or, if the other attempt was kept by Redis alone,
// decides them there, where Redis replays).
func (s *Service) resolveWaiting(ctx context.Context, cs *claims, reqs []Request, items []item, steps []step, out []Response, errs []error, round int) {
	idx := make([]int, 0, cs.waiting)
	for i := range cs.c {
		if cs.c[i].kind == claimWait {
			idx = append(idx, i)
		}
	}
	if round > 0 {
		// Waited once already: the other attempt is still undecided.
		for _, i := range idx {
			it := &items[i]
			out[i] = inFlight(steps[it.first : it.first+it.n])
		}
		return
	}
	wctx, cancel := context.WithTimeout(ctx, s.ids.maxWait)
	for _, i := range idx {
		s.ids.wait(wctx, cs.c[i].e)
	}
	cancel()
	sub := make([]Request, len(idx))
	for j, i := range idx {
		sub[j] = reqs[i]
	}
	subOut := make([]Response, len(idx))
	subErrs := make([]error, len(idx))
	s.decideBatch(ctx, sub, subOut, subErrs, round+1, false)
	for j, i := range idx {
		out[i], errs[i] = subOut[j], subErrs[j]
	}
}

// replayPath is what the admission log and the metrics call a step
// answered from the record.
const replayPath = "replay"
