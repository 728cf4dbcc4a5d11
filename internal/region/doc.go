// Package region owns what a region is and how a rule's scope maps onto
// regions (docs/architecture.md, Regions).
//
// A region is an ID, its own Redis primary, its own coordinator group and
// the agents that run in it. The Redis path is always region-local. A rule's
// scope says how far its number reaches:
//
//   - ScopeRegion (the default): every region enforces the whole rule on its
//     own, in its own Redis or from its own coordinators. N regions admit up
//     to N times the number.
//   - ScopeGlobal with mode redis: one number split across the regions by
//     weight. Region i enforces (B*w_i/W, r*w_i/W) in its own Redis, W the
//     sum of the weights; the shares sum to (B, r), so the global bound holds
//     with no traffic between regions, at the price of a static split.
//   - ScopeGlobal with mode leased: one budget leased down a hierarchy. A
//     global coordinator group leases region slices to the regional groups,
//     which sublease to their agents; a sublease never outlives its parent.
//     Each region also keeps a safe share (a rate, with the matching
//     fraction of the burst) that is never leased upward: cut off from the
//     global group, a region spends its slice until it expires, then only its
//     safe share. The global group leases (B - sum safe bursts, r - sum safe
//     rates), so while sum(safe) <= r the global bound holds for partitions
//     of any length; beyond that Overshoot is the worst-case excess.
//     Operators may change a region's safe share at run time on the global
//     group, which then counts max(old, new) and lets the region use
//     min(old, new) until the change is safe (internal/coordinator, safe.go).
//
// The package is pure: no I/O, no clock.
package region
