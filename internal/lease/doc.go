// Package lease owns the lease state machine of the coordinator: the pools
// and leases of every leased quota, the commands that change them, and the
// rules that keep the sum of what holders can spend within each quota
// (docs/architecture.md, Leases). It is pure and deterministic: no clock,
// no randomness, no I/O, no dependency on Raft or gRPC. The coordinator's FSM
// decodes log entries with DecodeCommand and applies them with
// State.Apply; agents spend their leases through Holding.
//
// # Time
//
// Time is int64 microseconds, taken only from commands: the leader stamps
// each entry with its clock, and the state makes it monotonic,
// now = max(now, last now). A LeaderElected entry marks a change of clock:
// the pools do not refill over the jump to it (two clocks cannot measure an
// interval), and every live lease's reclaim time is pushed to at least
// now + term + safety margin.
//
// Pools refill by the leader's clock, so a leader clock that runs fast by a
// factor rho refills them by rho*(r - sum(r_i))*T too much over T: the one
// overshoot left, bounded by the clock-rate drift bound that the safety
// margin already assumes.
//
// # State and conservation
//
// A quota Q = (B, r) has a pool P of unassigned tokens and live leases
// L_i = (id, holder, cap b_i, rate r_i, expiry e_i, reclaim time). Every lease
// is counted at its reserved sizes: max(old, new) while a shrink is
// unconfirmed (the holder may not have heard of it yet), its current sizes
// otherwise. After every step, for every quota:
//
//	P + sum(reserved b_i) <= B   and   sum(reserved r_i) <= r
//
// (State.CheckInvariants). The one exception is a ConfigureQuota that
// lowers B or r below what is already reserved: leases are never revoked,
// so the quota is then held to a ceiling, the reservations outstanding at
// that moment, which only falls (as leases shrink, expire or are released)
// until it is back to B and r; P stays 0 meanwhile, and no lease grows.
//
// # Token semantics
//
// The pool refills at r - sum(reserved r_i), up to B - sum(reserved b_i).
//
//   - Grant: the lease gets its cap b_i and rate r_i (its fair share, within
//     what the other reservations leave free), and its starting balance,
//     min(P, b_i), moves from P into the holder's bucket.
//   - Spending: the holder spends from its own bucket, which refills at r_i
//     up to b_i. Spent tokens are gone.
//   - Renew: the holder keeps its bucket. In each item it gives back Unused
//     tokens, which it took out of its bucket when it sent the renew and
//     never spends again (a holder may give back nothing, only what a shrink
//     left above its cap, or everything). The coordinator credits
//     min(Unused, bound) to P, within P's room B - sum(reserved b_i); bound
//     is an upper bound of the holder's unspent tokens (what it was given,
//     plus r_i-refill since, capped at b_i, minus what it gave back), so a
//     buggy or lying report cannot credit more than the holder could have.
//     It then sizes the lease anew and tops the bucket up from P by
//     min(P, b_i' - bound), which the holder adds on receipt, capping its
//     bucket at b_i'. A shrink takes nothing back: the holder moves what is
//     above its new cap out of its bucket and gives it back at its next
//     renewal, which also confirms the shrink.
//   - Release: the holder gives back its whole balance and stops; the lease
//     and all its reservations go, and min(Unused, bound) is credited. After
//     the lease's expiry nothing is credited.
//   - Expiry: a lease not renewed is reclaimed at Tick once expiry + safety
//     margin has passed; what it held is lost, never credited (the holder
//     may have spent it).
//   - Removal: Tick removes a quota that is idle, exactly what a new quota
//     of its shape is: no lease, no funding, P = B (its whole room), the
//     ceilings at B and r. A Grant with Config (or a ConfigureQuota)
//     creates it again, full; a new shape for an idle quota starts it
//     afresh the same way, whether or not Tick has removed it yet.
//
// Why this conserves: view the pool and each holder's bucket as sub-buckets
// with capacities B - sum(reserved b_i) and b_i <= reserved b_i, and refill
// rates r - sum(reserved r_i) and r_i <= reserved r_i: capacities sum to at
// most B and rates to at most r. Every step only moves tokens between
// sub-buckets or destroys them: a grant or top-up moves pool tokens into a
// bucket (a top-up never exceeds the room a grow leaves, so the pool always
// fits its shrunk capacity), a credit moves at most what the holder took out
// of its bucket and only into the pool's free room, and reclaiming, capping
// or failing to credit destroys. A sub-bucket never holds more than its
// capacity, and a holder's old sizes stay reserved for as long as it may use
// them (until it confirms the new ones, or its old term has ended on every
// clock, which the safety margin and the new-leader rule guarantee). So over
// any interval [t0, t1] the tokens held at t0 plus all refills bound what can
// be spent: total spend <= B + r*(t1 - t0). Removal changes none of this: a
// quota is removed only as a single full sub-bucket with nothing leased, and
// comes back as exactly that, so over an interval that spans its removal
// the same tokens are held at every moment as if it had stayed. (An idle
// quota given a larger shape comes back full at it, as a new quota would:
// full and with nothing leased, it owed nothing, and the bound holds from
// then on at the new shape.) This holds for holders that keep
// the rules of Holding; a holder that reports tokens it already spent can
// mint at most its bound per report, and no holder can make the coordinator
// exceed its own accounting: tokens handed out minus tokens credited never
// exceed B + r*(t1 - t0).
//
// # Sizing
//
// At every grant and renewal the coordinator water-fills r among the live
// leases of the quota by their reported demand (tokens per second, counting
// rejected requests) and weight (FairShare), each rate share within
// [MinSlice, MaxSlice]; caps take the same proportion of B (demands and
// slices scaled by B/r, or by the lease period when r is 0). A lease gets its
// share, limited to what the others' reservations leave free. So a holder
// whose share shrinks frees capacity at its next renewal (which confirms the
// shrink) or when its old term ends, and a holder whose share grows gets it
// at its first renewal after that: shares converge within about one lease
// period when holders renew every half period.
//
// The water level comes from per-quota aggregates (agg.go), updated as
// leases change and read in O(log n) per renewal, not from a water-filling
// of every lease; they are derived, rebuilt on restore, and every replica
// rounds them alike (the trees' shape depends only on their contents).
//
// # Idempotence
//
// Every holder command carries Seq, increasing per holder. A command with
// Seq <= the holder's last applied one is not applied: the last one gets the
// recorded answer again (Result.Replayed), so a retry after a lost reply
// receives the same lease, and anything older gets ErrStale. A retry must
// resend the same command: a different command under the last Seq gets the
// recorded answer if it is of the same kind, ErrStale otherwise. Credits
// need a live lease, so nothing is ever credited twice. The record outlives the
// holder's last lease by RecordTTL. A holder that restarts must either
// continue its sequence (e.g. seed it from the wall clock in microseconds)
// or use a new holder name.
//
// # Hierarchy (funded quotas)
//
// A quota configured with Funded holds only its own part (a region's safe
// share, possibly 0); Fund adds an upstream lease's cap and rate until its
// NotAfter, deposits the lease's tokens into the pool within its room, and
// bounds every lease term granted meanwhile by NotAfter: a sublease never
// outlives its parent. In the last quarter period before NotAfter a quota
// with an own part hands over to it: terms are full, sizes come out of the
// own part alone (handover.go, with the argument). The funding drops by itself at NotAfter (the pool
// refills under it only up to then, and gives up what no longer fits) and
// on LeaderElected (NotAfter was on the old leader's clock). Since the pool
// and the subleases together refill at most at (own + upstream) rate, up to
// (own + upstream) capacity, and hold the upstream lease's tokens only while
// it is valid, the regional quota is a Holding of the upstream lease plus
// its own part: conservation at the upper level carries down
// (hierarchy_test.go checks it with lost and reordered replies and cuts).
//
// # Bounded state
//
// The state holds the quotas in use, not every quota ever seen: Tick
// removes idle ones (see Removal above), so memory, snapshots and Tick's
// work follow the quotas with leases or refilling pools. Since a quota may
// be gone, a Grant carries its quota's shape (Config) and creates it; a
// renewal item of a quota that is gone is answered ErrLeaseExpired (it
// cannot have a live lease), so its holder grants again. Tick visits the
// quotas in map order: each quota's step touches only that quota, its
// leases and the sum of each holder's leases, and the reclaimed ids are
// sorted, so the order reaches neither the state nor the answer.
//
// QuotaConfig.MaxSubjects bounds the quotas of one rule (QuotaConfig.Rule)
// that exist at once: a command that would create one more is refused with
// ErrTooManySubjects (a Grant's refusal is an answer, recorded for replay).
//
// # Tuning
//
// Tune keeps operators' overrides of a rule's lease settings (per region or
// default) in the replicated state, so they are committed, snapshotted and
// kept across restarts. The state does not apply them: the coordinator reads
// them when it builds commands. Per-lease Bounds (in Grant and RenewItem)
// carry a region's own period and slice bounds into the water-filling.
//
// A tuning's SafeShare is kept apart from the other fields: only a Tune
// that sets it changes it (others and Clear keep it). In the global group
// a change is pending, with the value it replaces in SafePrev, until a
// Tune "settle" for the current target clears SafePrev (a second change is
// refused meanwhile); Counted and Allowed are max and min of the two. In a
// regional group, Tune "learn" records the value the global group told.
// The coordinator's safe.go holds the protocol and its argument.
//
// # Encoding
//
// EncodeCommand and DecodeCommand frame a command as a type byte, a version
// byte and the command, decoded strictly: Renew in binary (version 4,
// binary.go: every replica decodes every renewal, and JSON was the largest
// cost of applying one), every other kind as JSON; an unknown type or
// version is ErrUnknownCommand, on which the FSM must stop. A JSON command
// is written at the lowest version that has its fields (version 2 adds
// Grant.Config and ConfigureQuota's Rule and MaxSubjects, version 3
// QuotaConfig.StartEmpty), so entries without them read as before on every
// replica; JSON renewals of version 1, as older logs hold them, still
// decode (testdata/log-04749d6.bin). MarshalBinary and UnmarshalBinary
// encode the whole state deterministically, for Raft snapshots; Clone is a
// deep copy.
//
// Files: state.go (the State, Apply and the quota records), command.go
// (commands, their limits and validation), encoding.go and binary.go
// (commands' JSON and binary encodings, by version), pool.go (a quota's
// pool: what holders may refill), agg.go (per-quota aggregates, so a
// renewal costs O(log n)), fairshare.go and shares.go (max-min fair
// shares, and each lease beside its share), handover.go (a funded
// quota's hand-over to its own part), holding.go (the holder's half of a
// lease: spending, and the holder rules conservation rests on),
// grantbound.go (a grant held to the rule's shape by the holder),
// answer.go (answers recorded for replay), seq.go (holders' sequence
// numbers), inspect.go (read-only views for the admin API and metrics),
// errors.go (the sentinel errors).
package lease
