// Package bucket owns the token bucket: its arithmetic (a pure reference
// model that takes now as an argument), and the stores that hold bucket
// state, Redis (one Lua script per decision, server time) and memory.
//
// Every store implements the same contract, checked by one shared test suite:
// refill min(B, tokens + r*elapsed) with elapsed = max(0, now-last), so a clock
// that steps backwards grants nothing; allow and subtract when tokens >= cost,
// else deny with retryAfter = (cost - tokens) / r; a key expires only once the
// bucket would be full again; a repeated request id returns the recorded
// decision and charges nothing.
//
// Files: bucket.go (the store contract and its limits), model.go (the
// reference model: Take, Refund), memory.go (MemoryStore), redis.go
// (RedisStore: decisions, batches, pipelines), redis.lua (the bucket
// script) with redis_args.go and redis_reply.go (its arguments and
// replies), redis_open.go (the address forms: primary, Sentinel,
// Cluster), redis_nodes.go (a store's nodes, for per-node breakers),
// redis_errors.go (which Redis errors mean what), redis_warm.go and
// redis_rewarm.go (connections and scripts ready before the first
// decision, and again for a new master), hot.go, hot.lua and redis_hot.go
// (hot keys of mode auto: the marks that move a subject to leases).
package bucket
