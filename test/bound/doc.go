// Package bound holds the randomized bound checker: real coordinators
// (a 3-node Raft group), a real redis-server and real agents in-process,
// driven through every decision entry point of the agent (gRPC Allow,
// AllowBatch, AllowStream, Envoy's ShouldRateLimit, HTTP /v1/allow and
// /v1/check) while a seeded schedule reloads the rules, kills and restarts
// the Raft leader, stalls agents' links to the coordinators for longer
// than a lease, and starts new agents. Every admission is recorded from
// the callers' side as the span [send, answer], and each (rule, subject)
// is held to B + r*T in every window, with the largest shape the rule had
// in that window and the allowances docs/failure-policies.md and
// docs/configuration.md state. See docs/reliability.md (The bound
// checker) for how to run it longer or at another seed.
//
// The package has no code outside its tests.
package bound
