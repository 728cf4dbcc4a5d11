package bucket

import (
	"context"
	"hash/maphash"
	"sync"
	"time"
)

// memShards is how many independently locked parts a MemoryStore has.
const memShards = 128

// memSweepEvery is how often (µs of the store's clock) one shard drops its
// expired buckets and request-id records.
const memSweepEvery = int64(time.Second / time.Microsecond)

// MemoryStore keeps buckets in this process: the -dev store, and the local
// buckets of leased and emergency budgets. It follows the same contract as
// RedisStore, decided by the same model (Take, Refund), with the store's
// clock in place of Redis TIME.
//
// Keys are spread over sharded locks. A bucket is forgotten no earlier than
// the Redis script would let its key expire (full refill time after its last
// update plus a margin; never for rate 0), and request ids are remembered
// for DefaultRequestIDTTL. Forgetting is lazy: a shard drops its expired
// entries, in one pass, at most once per second of its clock, on the first
// call that finds it due.
type MemoryStore struct {
	clock  func() int64
	ridTTL int64 // µs
	seed   maphash.Seed
	shards [memShards]memShard
}

type memShard struct {
	mu      sync.Mutex
	buckets map[string]*memBucket
	ids     map[ridKey]*memRecord
	sweepAt int64
	_       [32]byte // 32 bytes of fields above: one shard per 64-byte cache line
}

type memBucket struct {
	st       HotState // State, and the hot-key fields of a mode auto rule's bucket
	expireAt int64    // µs; 0 = never
}

type ridKey struct{ key, id string }

type memRecord struct {
	res      Result
	refunded bool
	expireAt int64
}

// NewMemoryStore returns an empty store. clock returns µs since the Unix
// epoch; nil means the system clock. The store may see the clock step
// backwards: that refills nothing (the model's max(0, now-last)).
func NewMemoryStore(clock func() int64) *MemoryStore {
	if clock == nil {
		clock = func() int64 { return time.Now().UnixMicro() }
	}
	m := &MemoryStore{
		clock:  clock,
		ridTTL: int64(DefaultRequestIDTTL / time.Microsecond),
		seed:   maphash.MakeSeed(),
	}
	for i := range m.shards {
		m.shards[i].buckets = map[string]*memBucket{}
		m.shards[i].ids = map[ridKey]*memRecord{}
	}
	return m
}

// Take charges req.Cost against req.Key's bucket; see RedisStore.Take. It
// does no I/O and never fails but for bad input.
func (m *MemoryStore) Take(_ context.Context, req Request) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	now := m.clock()
	sh := m.lock(req.Key, now)
	defer sh.mu.Unlock()
	var rk ridKey
	if req.RequestID != "" {
		rk = ridKey{req.Key, req.RequestID}
		if rec := sh.ids[rk]; rec != nil && !expired(rec.expireAt, now) {
			res := rec.res
			res.Replayed = true
			return res, nil
		}
	}
	b := sh.buckets[req.Key]
	exists := b != nil && !expired(b.expireAt, now)
	if b == nil {
		b = &memBucket{}
		sh.buckets[req.Key] = b
	}
	if req.Hot != nil {
		st, res, _, _ := HotTakeHeld(b.st, exists, req.Limit, *req.Hot, req.Cost, req.HeldFor, now)
		b.setHot(st, req.Limit, now)
		return res, nil
	}
	st, d := take(b.st.State, exists, req.Limit, req.Cost, req.HeldFor, now)
	b.set(st, req.Limit, now)
	res := d.result(now)
	if req.RequestID != "" {
		sh.ids[rk] = &memRecord{res: res, expireAt: now + m.ridTTL}
	}
	return res, nil
}

// TakeBatch decides each request in turn; see RedisStore.TakeBatch.
func (m *MemoryStore) TakeBatch(ctx context.Context, reqs []Request, out []Outcome) {
	out = out[:len(reqs)]
	for i, req := range reqs {
		res, err := m.Take(ctx, req)
		out[i] = Outcome{Result: res, Err: err}
	}
}

// Refund gives req.Cost back, capped at the burst; see RedisStore.Refund.
func (m *MemoryStore) Refund(_ context.Context, req Request) error {
	if err := req.Validate(); err != nil {
		return err
	}
	now := m.clock()
	sh := m.lock(req.Key, now)
	defer sh.mu.Unlock()
	if req.RequestID != "" {
		rec := sh.ids[ridKey{req.Key, req.RequestID}]
		if rec == nil || expired(rec.expireAt, now) || !rec.res.Allowed || rec.refunded {
			return nil
		}
		rec.refunded = true
	}
	b := sh.buckets[req.Key]
	if b == nil || expired(b.expireAt, now) {
		return nil // missing is full: nothing to give back
	}
	if req.Hot != nil {
		b.setHot(HotRefund(b.st, req.Limit, req.Cost, now), req.Limit, now)
		return nil
	}
	b.set(Refund(b.st.State, req.Limit, req.Cost, now), req.Limit, now)
	return nil
}

// Mark extends the marks of promoted hot keys; see RedisStore.Mark.
func (m *MemoryStore) Mark(_ context.Context, marks []MarkRequest, out []MarkOutcome) {
	out = out[:len(marks)]
	for i, mr := range marks {
		out[i] = MarkOutcome{}
		if err := mr.Validate(); err != nil {
			out[i].Err = err
			continue
		}
		now := m.clock()
		sh := m.lock(mr.Key, now)
		b := sh.buckets[mr.Key]
		exists := b != nil && !expired(b.expireAt, now)
		var st HotState
		if exists {
			st = b.st
		}
		st, out[i].Result = HotMark(st, exists, mr, now)
		if exists && out[i].Result.Verdict != MarkGone {
			b.setHot(st, mr.Limit, now)
		}
		sh.mu.Unlock()
	}
}

// Ping always succeeds: the store is this process.
func (m *MemoryStore) Ping(context.Context) error { return nil }

// lock returns key's shard, locked, after sweeping it if it is due.
func (m *MemoryStore) lock(key string, now int64) *memShard {
	sh := &m.shards[maphash.String(m.seed, key)%memShards]
	sh.mu.Lock()
	if now >= sh.sweepAt {
		sh.sweep(now)
		sh.sweepAt = now + memSweepEvery
	}
	return sh
}

func (sh *memShard) sweep(now int64) {
	for k, b := range sh.buckets {
		if expired(b.expireAt, now) {
			delete(sh.buckets, k)
		}
	}
	for k, r := range sh.ids {
		if expired(r.expireAt, now) {
			delete(sh.ids, k)
		}
	}
}

func (b *memBucket) set(st State, l Limit, now int64) {
	b.st = HotState{State: st}
	b.expireAt = 0
	if ttl := expiresAfter(st, l, now); ttl > 0 {
		b.expireAt = now + ttl
	}
}

func (b *memBucket) setHot(st HotState, l Limit, now int64) {
	b.st = st
	b.expireAt = 0
	if ttl := hotExpiresAfter(st, l, now); ttl > 0 {
		b.expireAt = now + ttl
	}
}

func expired(expireAt, now int64) bool { return expireAt != 0 && now >= expireAt }
