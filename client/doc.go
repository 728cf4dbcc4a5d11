// Package client lets Go services use a Ration gateway-agent directly: a
// Client for the agent's gRPC API (ration.v1.RateLimiter), and Middleware
// for net/http that answers 429 or 503 with the right headers and passes
// admitted requests through.
//
// The package is a module of its own (github.com/ration-dev/ration/client):
// it brings gRPC, protobuf and the generated API
// (github.com/ration-dev/ration/proto), and none of the agent's or the
// coordinator's dependencies (Redis, Raft, BoltDB, Envoy's API).
//
// A Client holds one gRPC connection to the agent (normally a sidecar on
// loopback) and multiplexes every call over it. Each decision has a
// deadline (Options.Timeout, default 250ms, or the caller's if earlier),
// and each AllowBatch call its own (Options.BatchTimeout, default 2s).
// Create one Client per agent, share it, Close it on shutdown.
//
//	c, err := client.New("127.0.0.1:8081", client.Options{})
//	if err != nil { ... }
//	defer c.Close()
//
//	limit := client.Middleware(c, func(r *http.Request) (client.Request, bool) {
//		return client.Request{Descriptors: map[string]string{
//			"tenant":   r.Header.Get("X-Tenant"),
//			"endpoint": "search",
//		}}, true
//	}, client.MiddlewareOptions{})
//	http.Handle("/search", limit(searchHandler))
//
// Three ways to ask: Allow (one request), AllowBatch (up to 10,000
// independent requests in one call) and a Stream (AllowStream: one
// long-lived HTTP/2 stream carrying every decision). Concurrent Allow
// calls on one Client coalesce: while one is on the wire, the next ones
// wait (at most Options.CoalesceDelay, 200µs by default) to go out together
// in one AllowBatch call, which the agent decides in one round trip to its
// store, each caller still getting its own decision, error and deadline.
// Middleware takes any Allower: a Client, a Stream, or in tests the fake of
// package clienttest, which decides in memory.
//
// The middleware answers:
//
//   - admitted: the handler's response, with RateLimit-Policy and RateLimit
//     (IETF draft-ietf-httpapi-ratelimit-headers-11) when a rule applied and
//     a bucket was read;
//   - quota spent: 429 with Retry-After, RateLimit-Policy and RateLimit;
//   - the agent's store down under a fail_closed rule, or the agent itself
//     unreachable: 503 with Retry-After: 1 (MiddlewareOptions.FailOpen lets
//     requests through when the agent is unreachable instead);
//   - descriptors the agent rejects (a value over 256 bytes, say): 400.
//
// The same fields, computed by the same code, come from the agent's HTTP
// check endpoint and its Envoy rate-limit service, so clients see one
// format whichever gateway is in front.
package client
