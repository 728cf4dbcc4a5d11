package bucket

import (
	"context"
	"fmt"
)

// Hooks for the external tests (package bucket_test). Those live outside the
// package because they use internal/harness, whose Raft helpers import
// packages that import bucket.

// ScriptSHA names the bucket script on a Redis server.
var ScriptSHA = scriptSHA

// ExpiryMargin is added to a bucket's time to full before it may expire.
const ExpiryMargin = expiryMargin

// RequestIDKey names the record of request id under key.
var RequestIDKey = requestIDKey

// Decision is a take decision with its floats as computed, before they
// become durations.
type Decision struct {
	Allowed              bool
	Tokens, Retry, Reset float64 // tokens left; seconds
	Now                  int64
	Replayed             bool
}

// ModelDecide is Take reporting the model's floats.
func ModelDecide(s State, exists bool, l Limit, cost float64, now int64) (State, Decision) {
	return ModelDecideHeld(s, exists, l, cost, 0, now)
}

// ModelDecideHeld is TakeHeld reporting the model's floats.
func ModelDecideHeld(s State, exists bool, l Limit, cost float64, heldFor, now int64) (State, Decision) {
	s, d := take(s, exists, l, cost, heldFor, now)
	return s, Decision{Allowed: d.allowed, Tokens: d.tokens, Retry: d.retry, Reset: d.reset, Now: now}
}

// TakeRaw is Take reporting the script's reply as it came.
func (s *RedisStore) TakeRaw(ctx context.Context, req Request) (Decision, error) {
	r, err := s.take(ctx, req)
	return Decision{Allowed: r.allowed, Tokens: r.tokens, Retry: r.retry, Reset: r.reset, Now: r.now, Replayed: r.replayed}, err
}

// TakeBatchRaw is TakeBatch reporting the script's replies as they came.
func (s *RedisStore) TakeBatchRaw(ctx context.Context, reqs []Request) ([]Decision, []error) {
	out, errs := make([]Decision, len(reqs)), make([]error, len(reqs))
	s.takeBatch(ctx, reqs, func(i int, r takeReply, err error) {
		out[i] = Decision{Allowed: r.allowed, Tokens: r.tokens, Retry: r.retry, Reset: r.reset, Now: r.now, Replayed: r.replayed}
		errs[i] = err
	})
	return out, errs
}

// ParseTakesReply is parseTakesReply collecting its answers.
func ParseTakesReply(reply string, reqs []Request) ([]Decision, []error) {
	out, errs := make([]Decision, len(reqs)), make([]error, len(reqs))
	answered := make([]bool, len(reqs))
	parseTakesReply(reply, reqs, func(j int, r takeReply, err error) {
		if answered[j] {
			panic(fmt.Sprintf("request %d answered twice", j))
		}
		answered[j] = true
		out[j] = Decision{Allowed: r.allowed, Tokens: r.tokens, Retry: r.retry, Reset: r.reset, Now: r.now}
		errs[j] = err
	})
	for j, ok := range answered {
		if !ok {
			errs[j] = fmt.Errorf("request %d not answered", j)
		}
	}
	return out, errs
}

// RefundRaw is Refund also reporting whether it credited (a missing bucket
// counts as credited) and the server time the script used.
func (s *RedisStore) RefundRaw(ctx context.Context, req Request) (refunded bool, now int64, err error) {
	return s.refund(ctx, req)
}

// Holds reports whether m has a bucket or request-id record for key.
func (m *MemoryStore) Holds(key string) bool {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		_, ok := sh.buckets[key]
		for k := range sh.ids {
			ok = ok || k.key == key
		}
		sh.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// SweepNow sweeps key's shard as if it were due.
func (m *MemoryStore) SweepNow(key string) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		sh.sweepAt = 0
		sh.mu.Unlock()
	}
	m.lock(key, m.clock()).mu.Unlock()
}

// Size counts the buckets and request-id records held.
func (m *MemoryStore) Size() (buckets, ids int) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		buckets += len(sh.buckets)
		ids += len(sh.ids)
		sh.mu.Unlock()
	}
	return buckets, ids
}

// HotDecision is a hot-key take as the script or the model made it.
type HotDecision struct {
	Allowed   bool
	Tokens    float64
	Now       int64
	Leased    bool
	Promotion Promotion
}

// HotTakeRaw is Take of a hot-key request reporting the script's reply as
// it came.
func (s *RedisStore) HotTakeRaw(ctx context.Context, req Request) (HotDecision, error) {
	r, err := s.take(ctx, req)
	return HotDecision{Allowed: r.allowed, Tokens: r.tokens, Now: r.now, Leased: r.leased, Promotion: r.promo}, err
}

// ModelHotTake is HotTake reporting the model's floats.
func ModelHotTake(s HotState, exists bool, l Limit, h Hot, cost float64, now int64) (HotState, HotDecision) {
	return ModelHotTakeHeld(s, exists, l, h, cost, 0, now)
}

// ModelHotTakeHeld is HotTakeHeld reporting the model's floats.
func ModelHotTakeHeld(s HotState, exists bool, l Limit, h Hot, cost float64, heldFor, now int64) (HotState, HotDecision) {
	s, d, leased, p := hotTake(s, exists, l, h, cost, heldFor, now)
	return s, HotDecision{Allowed: d.allowed, Tokens: d.tokens, Now: now, Leased: leased, Promotion: p}
}

// ExpiresAfter is expiresAfter: how long after now the bucket of state s
// may be forgotten, in µs (0: never).
var ExpiresAfter = expiresAfter

// HotExpiresAfter is hotExpiresAfter.
var HotExpiresAfter = hotExpiresAfter

// ScriptSource is the bucket script (redis.lua).
var ScriptSource = scriptSrc

// ScriptArgv is what the store passes the bucket script after its keys
// (ARGV) for req, as strings.
func (s *RedisStore) ScriptArgv(req Request) []string {
	args := s.cmd(context.Background(), opTake, req, true).Args()
	nkeys := args[2].(int)
	var out []string
	for _, a := range args[3+nkeys:] {
		out = append(out, fmt.Sprint(a))
	}
	return out
}

// SetNodeConnHook makes f run where concurrent first uses of a Cluster
// master race (nodeConn), before s serves any decision.
func SetNodeConnHook(s *RedisStore, f func()) { s.nodeConnHook = f }
