package coordinator

import (
	"context"
	"maps"
	"math"
	"strings"

	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/region"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Safe shares tuned at run time (docs/operations.md, "Changing a safe
// share"). The global group is the source of truth: an operator's Tune of
// safe_share for (rule, region R) is committed there, in R's tuning record
// (lease.Tuning.SafeShare, the target; SafePrev, the value it replaces,
// while the change is pending). Every value is a rate in tokens/s, with the
// matching fraction of the burst (region.Safe).
//
//   - The global group leases (B, r) less every region's COUNTED safe
//     share, max(SafePrev, SafeShare) while pending (quotaFor).
//   - It tells R, in every answer to R's holder, the ALLOWED safe share,
//     min(SafePrev, SafeShare) while pending (Grant.safe_share).
//   - R's leader keeps the last value it was told in its own replicated
//     state (Tune with Safe "learn") and sizes its funded quotas' own part
//     by it (quotaFor); it confirms a value (RenewItem.confirmed_safe_share)
//     only once every funded quota of the rule runs within it plus its
//     upstream lease (own part configured at it, ceilings fitted).
//   - The change settles (Tune with Safe "settle", SafePrev cleared, so
//     counted = allowed = the target) when it is safe to:
//     a raise once the global group's quotas of the rule fit the leasable
//     size computed with the raised value (every outstanding lease, to any
//     region, is confirmed at the smaller size or reclaimed); a lowering
//     once R confirms the lowered value.
//
// Invariant: what R may use is at most its counted safe share. The
// allowed value never exceeds the counted one, R only ever uses a value
// it was told, and the counted value only falls when R confirms it runs
// at the allowed one (answers reach R in the order they were made: the
// upstream loop has one request in flight and drops late answers). So the
// regions' own parts plus everything the global group leases stay within
// (B, r) whenever sum(counted) <= r, as with the rules file's shares.

// safeTol is the float tolerance of the size comparisons below.
func safeTol(v float64) float64 { return 1e-9 * max(1, math.Abs(v)) }

// countedRegions returns rule r's regions with each one's safe share as
// the global group counts it (tuned, pending or from the rules file).
func (n *Node) countedRegions(r *rules.Rule) map[region.ID]region.Weight {
	out := maps.Clone(r.Regions)
	n.fsm.read(func(s *lease.State) {
		for id, w := range out {
			if t, ok := s.Tuning(r.Name, string(id)); ok {
				if v, ok := t.Counted(); ok {
					w.SafeShare = v
					out[id] = w
				}
			}
		}
	})
	return out
}

// learnedSafe is a regional group's safe share of rule: the value learned
// from the global group, else the rules file's.
func (n *Node) learnedSafe(r *rules.Rule) float64 {
	if v := n.tuningOf(r.Name, n.cfg.Region).SafeShare; v != nil {
		return *v
	}
	return r.Regions[region.ID(n.cfg.Region)].SafeShare
}

// globalFits reports whether every quota of rule in the global group is
// configured at, and its outstanding leases fit within, leasable.
func (n *Node) globalFits(rule string, leasable region.Share) bool {
	ok := true
	n.fsm.read(func(s *lease.State) {
		for _, name := range s.Quotas() {
			if !strings.HasPrefix(name, rule+"|") {
				continue
			}
			q, _ := s.Quota(name)
			if idle(q) {
				continue
			}
			if q.Burst > leasable.Burst+safeTol(leasable.Burst) || q.Rate > leasable.Rate+safeTol(leasable.Rate) ||
				q.CeilBurst > q.Burst+safeTol(q.Burst) || q.CeilRate > q.Rate+safeTol(q.Rate) {
				ok = false
			}
		}
	})
	return ok
}

// idle reports whether a quota has no lease outstanding: nothing can be
// spent from it until a grant, which reconfigures it first (the pool gives
// up what no longer fits), so its configured size does not matter yet.
func idle(q lease.QuotaInfo) bool {
	return q.Leases == 0 && q.ReservedCap == 0 && q.ReservedRate == 0
}

// settleSafe (global group, after a region's renewal was applied)
// settles the pending safe-share changes of the region's rules in items
// that have become safe, then fills in each answer's safe share.
func (n *Node) settleSafe(ctx context.Context, set *rules.Set, id region.ID, items []*rationv1.RenewItem, grants []*rationv1.Grant) {
	seen := map[string]bool{}
	var ops []pendingOp
	for _, it := range items {
		name := it.GetQuota().GetRule()
		if seen[name] {
			continue
		}
		seen[name] = true
		r, ok := set.Rule(name)
		if !ok || r.Scope != region.ScopeGlobal || r.Mode != rules.ModeLeased {
			continue
		}
		t := n.tuningOf(name, string(id))
		if !t.Pending() {
			continue
		}
		target := *t.SafeShare
		settle := false
		if target < *t.SafePrev {
			// A lowering: settled by the region's confirmation.
			for _, o := range items {
				if o.GetQuota().GetRule() == name && o.ConfirmedSafeShare != nil && o.GetConfirmedSafeShare() == target {
					settle = true
				}
			}
		} else {
			// A raise: settled once the global group's leases fit.
			l := region.Leasable(r.Burst, r.Rate, n.countedRegions(r))
			settle = n.globalFits(name, l)
		}
		if settle {
			v := target
			ops = append(ops, pendingOp{cmd: lease.Tune{Tuning: lease.Tuning{Rule: name, Region: string(id), SafeShare: &v}, Safe: lease.SafeSettle}})
		}
	}
	if len(ops) > 0 {
		if res, err := n.propose(ctx, &proposal{ops: ops}); err != nil {
			n.logger.Debug("settling a safe-share change failed; the next renewal retries", "err", err)
		} else {
			for i, r := range res {
				if r.Err == nil {
					tu := ops[i].cmd.(lease.Tune).Tuning
					n.logger.Info("safe-share change settled", "rule", tu.Rule, "region", tu.Region, "safe_share", *tu.SafeShare)
				}
			}
		}
	}
	for i, it := range items {
		if grants[i].GetError() != "" {
			continue
		}
		if a, ok := n.tuningOf(it.GetQuota().GetRule(), string(id)).Allowed(); ok {
			grants[i].SafeShare = &a
		}
	}
}

// checkSafeTune validates an operator's safe share v for (r, reg) in the
// global group, adding every problem to bad, and returns the value the
// Tune replaces when the record has none (the rules file's).
func (n *Node) checkSafeTune(r *rules.Rule, reg string, v float64, allowOvershoot bool, bad func(string, ...any)) (prev float64, ok bool) {
	switch {
	case n.cfg.Upstream != "":
		bad("safe_share: set it on the global group, which tells the regions (a regional group only learns it)")
		return 0, false
	case r == nil:
		return 0, false
	case r.Scope != region.ScopeGlobal:
		bad("safe_share: rule %q is scope: region; only scope: global rules have safe shares", r.Name)
		return 0, false
	case reg == "":
		bad("safe_share: region required (a safe share is per region)")
		return 0, false
	case !(v >= 0 && v <= lease.MaxValue):
		bad("safe_share %v: must be in [0, %g] tokens/s", v, float64(lease.MaxValue))
		return 0, false
	}
	w, in := r.Regions[region.ID(reg)]
	if !in {
		return 0, false // reported with the region
	}
	cur := n.tuningOf(r.Name, reg)
	if cur.Pending() {
		bad("safe_share %v: the change of region %q from %v to %v is still pending (see `coordinator tunings`); wait until it settles", v, reg, *cur.SafePrev, *cur.SafeShare)
		return 0, false
	}
	counted := n.countedRegions(r)
	target := counted[region.ID(reg)]
	target.SafeShare = v
	want := maps.Clone(counted)
	want[region.ID(reg)] = target
	if o := region.Overshoot(r.Burst, r.Rate, want); (o.Rate > 0 || o.Burst > 0) && !allowOvershoot {
		t := region.SafeTotal(r.Burst, r.Rate, want)
		bad("safe_share %v: the safe shares of rule %q would sum to %v tokens/s, above its rate %v (sum(safe) <= r keeps the global bound; set allow_overshoot to accept)", v, r.Name, t.Rate, r.Rate)
		return 0, false
	}
	during := maps.Clone(counted)
	target.SafeShare = max(v, counted[region.ID(reg)].SafeShare)
	during[region.ID(reg)] = target
	if l := region.Leasable(r.Burst, r.Rate, during); !(l.Burst > 0) && !allowOvershoot {
		bad("safe_share %v: while the change is pending the safe shares of rule %q take its whole burst; nothing would be left to lease (set allow_overshoot to accept)", v, r.Name)
		return 0, false
	}
	return w.SafeShare, true
}
