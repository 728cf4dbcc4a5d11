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
//     and spending through Take; a regional group's upstream lease is an
//     internal/lease Holding.
//   - Modelled: Raft itself (a group is one committed state; an entry
//     commits when the leader reaches a majority, one round trip to its
//     nearest live follower; a leader that cannot reach a majority commits
//     nothing, and an election follows its loss), the coordinator's request
//     handling (the mapping of a RenewRequest to commands and of results to
//     grants, written after internal/coordinator's leasesServer), and the
//     regional group's upstream loop (written after
//     internal/coordinator/upstream.go, with safe shares 0 and without
//     nudges). With Config.Nudges, each regional leader plans nudges as
//     internal/coordinator's planner does (coordinator.PlanQuota) and sends
//     them over the network to the holders (holder.Leases.Nudge); without,
//     holders renew at their renew points, on shrinks and when their slice
//     runs dry.
//
// One seed is one exact run: a single goroutine owns the event queue; an
// agent's Round runs as a coroutine (iter.Pull) only while the event loop
// waits for it (a switch at each Client call), and every
// random draw comes from one generator seeded by Config.Seed. Holders scan
// their quotas in a fixed order (holder.Options.SortedScans). Two kinds of
// work leave the loop's goroutine without changing what it computes: each
// step's decisions, region by region on a few goroutines (a region's
// decisions touch only its agents), and the groups' committed entries,
// applied in commit order by one applier goroutine whose results the loop
// waits for where it reads them (apply.go).
package sim
