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
package bucket
