// Package coordinator runs the Raft group that replicates the lease state
// machine (package lease) and serves leases to gateway agents over gRPC
// (ration.v1.Leases, on -grpc), with an admin API (ration.v1.Admin) on a
// listener of its own (-admin), /metrics, /healthz and /readyz. It owns:
//
//   - FSM: Raft log entries are a type byte then a payload (entry.go). A
//     command entry carries one lease command; a batch entry carries many,
//     so the leader commits many renewals in one entry; a member entry maps
//     a Raft server id to its lease address, an admin entry to its admin
//     address. An entry that cannot be decoded stops the node rather than
//     let it diverge.
//   - Node: hashicorp/raft over TCP, BoltDB (raft-boltdb/v2) for the log
//     and stable store, file snapshots; bootstrap, join through a member's
//     admin API, removal, leadership transfer on graceful shutdown.
//   - Leader duties (leader.go): every command is stamped with the leader's
//     clock, made monotonic; a Tick is committed every TickInterval; a new
//     leader commits LeaderElected first and serves nothing (UNAVAILABLE)
//     until it and everything before it is applied; concurrent requests are
//     batched into few entries and each is answered from its own results
//     once its entry is applied.
//   - Client (internal/coordclient, aliased here): what agents use to
//     reach the leader (follows the "ration-leader" trailer, retries
//     UNAVAILABLE with bounded backoff).
//   - Regions (docs/architecture.md, Regions): a group started with
//     -upstream is regional. Its leader holds one lease per scope: global,
//     mode: leased quota from the global group (upstream.go, holder
//     region/<-region>) and funds the regional quota with it (lease.Fund);
//     quotaFor gives each role its shape (regional: the safe share plus
//     funding; global: the rule less every safe share, regions weighted).
//   - Operators' tuning (tune.go): Admin.Tune commits lease.Tune records,
//     which quotaFor and the upstream loop apply when they build commands.
//
// # Member table: why in the replicated state
//
// Followers must name the leader's gRPC address, but hashicorp/raft's
// configuration holds only Raft addresses, with no metadata. So gRPC
// addresses live in the FSM, written by member entries: AddVoter records
// the joining server's address (before adding it to the configuration),
// and every new leader records its own address in the same entry as its
// LeaderElected. A follower therefore knows the current leader's address
// as soon as it has applied the entry that made that leader serve, and it
// survives restarts and snapshots with the rest of the state.
//
// # Sequence numbers
//
// A Renew or Release request becomes several lease commands (a Grant per
// new lease, one Renew for the rest, or one Release per lease), committed
// together in one entry, numbered seq, seq+1, ...; a holder's next request
// must use a seq of at least seq + len(items). See leasesServer.
package coordinator
