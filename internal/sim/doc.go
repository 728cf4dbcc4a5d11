// Package sim is a deterministic simulation of Ration's lease protocol at
// scale: thousands of agents in tens of regions, a Raft group per region
// plus a global one, under simulated time, network, clocks and faults.
//
// What is real and what is modelled:
//
//   - Real: every coordinator group's state is an internal/lease State,
//     changed only by lease commands applied in log order (Grant, Renew,
//     Release, Tick, LeaderElected, Fund), as the coordinator's FSM applies
//     them; every agent is an internal/holder Leases (the same code the
//     gateway-agent runs), driven by Options.Clock and Round instead of Run,
//     and spending through Take; a request becomes commands and their
//     results its answer through internal/coordinator's own request
//     handling (coordinator.PlanRenew, coordinator.PlanRelease), with
//     quotas resolved from the simulated rules; each regional leader runs
//     internal/coordinator's upstream loop (coordinator.Upstream, a new one
//     per term), with safe shares 0 and without the global leader's
//     nudges, its Round a coroutine like an agent's (upstream.go).
//   - Modelled: Raft itself (a group is one committed state; an entry
//     commits when the leader reaches a majority, one round trip to its
//     nearest live follower; a leader that cannot reach a majority commits
//     nothing, and an election follows its loss; each entry records the
//     nodes that have it, and the next leader, one with the most complete
//     log, commits the lost term's entries it has before its own, unanswered,
//     while those it lacks are gone). With Config.Nudges, each regional
//     leader plans nudges as internal/coordinator's planner does
//     (coordinator.PlanQuota) and sends them over the network to the
//     holders (holder.Leases.Nudge); without, holders renew at their renew
//     points, on shrinks and when their slice runs dry.
//
// One seed is one exact run: a single goroutine owns the event queue; an
// agent's Round, and an upstream loop's, runs as a coroutine (iter.Pull)
// only while the event loop waits for it (a switch at each call and, for
// the upstream loop, at its Fund entry's commit), and every
// random draw comes from one generator seeded by Config.Seed. Holders scan
// their quotas in a fixed order (holder.Options.SortedScans). Two kinds of
// work leave the loop's goroutine without changing what it computes: each
// step's decisions, region by region on a few goroutines (a region's
// decisions touch only its agents), and the groups' committed entries,
// applied in commit order by one applier goroutine whose results the loop
// waits for where it reads them (apply.go).
package sim
