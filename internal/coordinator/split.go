package coordinator

import (
	"fmt"
	"sync"
	"time"

	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/rules"
)

// The two parts of a subject's budget under lease.default_share f are two
// quotas: the rule's default quota (rules.DefaultSubject, the part f) and
// the subject's own (1-f). Each is conserved on its own, at its ceiling
// (its configured size, or more while a shrink has larger leases
// outstanding). A subject's admissions through both are within the rule
// (B + r*T) as long as the two ceilings sum to at most the rule's burst
// and rate, at every moment: each part's spend over a window is at most
// what it held at the start plus its refill, both bounded by its
// ceiling.
//
// A change of f moves size from one part to the other. Each quota is
// reconfigured at its own next renewal, and the one that shrinks stays
// reserved at its old size until its holders confirm or their old terms
// end, so growing the other at once let a subject have max(f) + max(1-f)
// of its rule. So a part grows only into what the other part leaves: its
// size is its target (f, or 1-f, of the rule) held to the rule less the
// other part's claim, the larger of that part's target and its ceiling
// (every subject's, for the default quota), but never below the size it
// already has (which fits, as the ceilings always sum within the rule).
// Idle quotas (no lease outstanding) claim only their target: nothing is
// spent from them before a grant, which reconfigures them first.

// splitClaimTTL is how long a computed claim is reused while it is above
// its part's target (a change of f in flight): the subjects' claim is a
// scan of the rule's quotas.
const splitClaimTTL = 100 * time.Millisecond

// claimKey is what a cached claim was computed for: the rule, which part
// claims (the default quota's, or its subjects'), f and the rule's shape.
type claimKey struct {
	rule               string
	subjects           bool
	share, burst, rate float64
}

type claimEntry struct {
	burst, rate float64 // the largest ceiling found, before the target
	at          time.Time
}

// splitClaims caches claims, so that a renewal in the steady state reads
// no quota of the state for them. For one key a claim only falls: a
// quota's ceiling rises only when it is configured, within its target,
// which the claim includes. So a claim at the target is final for its
// key, and an older one above it errs on the safe side.
type splitClaims struct {
	mu sync.Mutex
	m  map[claimKey]claimEntry
}

// holdSplit holds c, the quota of subject of rule r (a rule with "*"
// keys) sized at its part of the rule's whole shape (wholeB, wholeR), to
// what the rule's other part leaves. It returns an item error when the
// quota does not exist yet and nothing is left for it.
func (n *Node) holdSplit(r *rules.Rule, subject, id string, wholeB, wholeR float64, c *lease.ConfigureQuota) string {
	f := r.Lease.DefaultShare
	isDefault := subject == rules.DefaultSubject
	other := f // the other part's target, as a part of the rule
	if isDefault {
		other = 1 - f
	}
	claimB, claimR := n.splitClaim(claimKey{rule: r.Name, subjects: isDefault, share: f, burst: wholeB, rate: wholeR})
	claimB, claimR = max(claimB, wholeB*other), max(claimR, wholeR*other)
	// Rounding alone (f*B + (1-f)*B need not be B exactly) never holds a
	// part back: the target stays the target, as configured before.
	roomB, roomR := wholeB-claimB, wholeR-claimR
	if roomB >= c.Burst-safeTol(wholeB) && roomR >= c.Rate-safeTol(wholeR) {
		return ""
	}
	var cur lease.QuotaInfo
	var exists bool
	n.fsm.read(func(s *lease.State) {
		if q, ok := s.Quota(id); ok && !idle(q) {
			cur, exists = q, true
		}
	})
	burst, rate := c.Burst, c.Rate
	if roomB < c.Burst-safeTol(wholeB) {
		burst = max(roomB, min(cur.Burst, c.Burst))
	}
	if roomR < c.Rate-safeTol(wholeR) {
		rate = max(roomR, min(cur.Rate, c.Rate))
	}
	if !(burst > safeTol(wholeB)) {
		if !exists {
			return fmt.Sprintf("rule %q: lease.default_share changed, and the other part of its subjects' budget still has larger leases outstanding; this part is leased once they have shrunk", r.Name)
		}
		// What it has, within its target: a valid (positive) size.
		burst = min(cur.Burst, c.Burst)
	}
	if rate < lease.MinRate {
		rate = 0
	}
	c.Burst, c.Rate = burst, rate
	c.MinSlice = min(c.MinSlice, rate)
	if c.MaxSlice != 0 {
		c.MaxSlice = max(c.MinSlice, min(c.MaxSlice, rate))
	}
	return ""
}

// splitClaim is the largest ceiling (burst, rate) of the quotas of the
// part k names that have leases outstanding: the rule's default quota, or
// every other quota of the rule (its subjects'). Cached (splitClaims).
func (n *Node) splitClaim(k claimKey) (burst, rate float64) {
	target := k.share
	if k.subjects {
		target = 1 - k.share
	}
	n.claims.mu.Lock()
	e, ok := n.claims.m[k]
	n.claims.mu.Unlock()
	if ok && (e.burst <= k.burst*target+safeTol(k.burst) && e.rate <= k.rate*target+safeTol(k.rate) ||
		time.Since(e.at) < splitClaimTTL) {
		return e.burst, e.rate
	}
	def := QuotaID(k.rule, rules.DefaultSubject)
	n.fsm.read(func(s *lease.State) {
		if !k.subjects {
			if q, ok := s.Quota(def); ok && !idle(q) {
				burst, rate = q.CeilBurst, q.CeilRate
			}
			return
		}
		s.RangeQuotas(k.rule+"|", func(q lease.QuotaInfo) {
			if q.Name != def && !idle(q) {
				burst, rate = max(burst, q.CeilBurst), max(rate, q.CeilRate)
			}
		})
	})
	n.claims.mu.Lock()
	if n.claims.m == nil {
		n.claims.m = map[claimKey]claimEntry{}
	}
	n.claims.m[k] = claimEntry{burst: burst, rate: rate, at: time.Now()}
	n.claims.mu.Unlock()
	return burst, rate
}
