// Package bound holds the randomized bound checker: real coordinators
// (a 3-node Raft group, region eu's, leasing its global rule from a
// 1-node global group, and a second region's single node), a real
// redis-server primary with a replica, real agents in-process and one
// agent process of region eu (the test binary re-executed as a
// gateway-agent, TestMain), driven through every decision entry point of
// the agent (gRPC Allow, AllowBatch, AllowStream, Envoy's ShouldRateLimit,
// HTTP /v1/allow and /v1/check) while a seeded schedule reloads the rules,
// kills and restarts the regional Raft leader, stalls agents' links to the
// coordinators for longer than a lease, pauses the agent process whole
// (SIGSTOP) for as long with calls in flight to it (and every caller sent
// to it after its SIGCONT), resets agents' links or drops the
// coordinators' replies (so the agents' coordinator clients retry and
// their streams break), cuts a region off the global group for longer
// than its upstream lease (a region cut), starts new agents, fails Redis
// over to a replica whose link was cut (a suffix of writes lost), and
// steps the Redis servers' clocks. Every admission is recorded from the
// callers' side as the span [send, answer], and each (rule, subject) is
// held to B + r*T in every window, the global rule's across both
// regions' agents, with the largest shape the rule had in that window
// and the allowances docs/failure-policies.md and docs/configuration.md
// state (a mode switch; a Redis failover; a forward step of Redis's
// clock; none for a region cut, as the safe shares sum below r).
//
// It does not reach: a leader kill of the global group (one node) or of
// the second region's, a reload of the global rule, Redis Cluster or
// Sentinel, a promoted key evicted under a memory policy, a pause of any
// agent but the one process or of a coordinator, coordinators whose
// clocks differ (in-process nodes share one). A pause inside a decision
// (between its clock reading and its spend) lies inside the call's span,
// which no judge from the callers' side can see into. See
// docs/reliability.md (The bound checker) for what each of those is
// checked by, and how to run the checker longer or at another seed.
//
// The package has no code outside its tests.
package bound
