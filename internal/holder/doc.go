// Package holder owns the agent's side of the lease path: for every leased
// quota (rule, subject) the agent has used, a lease.Holding that decisions
// spend from in memory, with no I/O on the request path, and one background
// loop that renews all of the agent's leases in one message, reports demand,
// adopts answers under the holder rules of lease.Holding, and releases
// unused budget on shutdown or when a quota goes idle.
//
// Safety rests on lease.Holding: a lease is spent only until
// D(1-rho)/(1+rho) - m after the request that obtained it was SENT, on this
// process's monotonic clock, whatever the coordinator or the network do.
//
// Files: holder.go (options, Leases, its clock and its Run loop), quota.go
// (one quota's state and demand estimate), spend.go (decisions: Spend,
// Ref, Refund, Prepare), set.go (the set of quotas: adding, looking up,
// flagging, forgetting), renew.go (one round of the loop: what is due,
// the Renew and Release requests and adopting their answers),
// shared.go (lease.default_share: the default lease and its copies, and
// giving back the own leases of subjects whose copies suffice again),
// held.go (held spends: tokens taken now and spent later, elsewhere, as
// an RLQS take), lend.go (loans to a delegate such as an Envoy's RLQS
// bucket: Offer, Lend, returns), ready.go (readiness: the leases fetched
// before the agent takes traffic) and metrics.go.
package holder
