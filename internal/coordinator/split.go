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

// splitClaimTTL is how long a computed claim of a rule's subjects is
// reused while it is above their target (a change of f in flight): the
// claim is a scan of the rule's quotas.
const splitClaimTTL = 100 * time.Millisecond

// claimKey is what a cached claim of a rule's subjects was computed for.
type claimKey struct {
	share, burst, rate float64
}

type claimEntry struct {
	key         claimKey
	burst, rate float64
	at          time.Time
}

// subjectClaims caches, per rule, the largest ceiling of its subjects'
// quotas. For one key (f and the rule's shape) the claim only falls: a
// subject's ceiling rises only when it is configured, within its target,
// which the claim includes. So a claim at the target is final for the
// key, and an older one above it errs on the safe side.
type subjectClaims struct {
	mu sync.Mutex
	m  map[string]claimEntry
}

// holdSplit holds c, the quota of subject of rule r (a rule with "*"
// keys) sized at its part of the rule's whole shape (wholeB, wholeR), to
// what the rule's other part leaves. It returns an item error when the
// quota does not exist yet and nothing is left for it.
func (n *Node) holdSplit(r *rules.Rule, subject, id string, wholeB, wholeR float64, c *lease.ConfigureQuota) string {
	f := r.Lease.DefaultShare
	var claimB, claimR float64
	var cur lease.QuotaInfo
	var exists bool
	if subject == rules.DefaultSubject {
		claimB, claimR = n.subjectsClaim(r.Name, id, claimKey{f, wholeB, wholeR})
	}
	n.fsm.read(func(s *lease.State) {
		if q, ok := s.Quota(id); ok && !idle(q) {
			cur, exists = q, true
		}
		if subject != rules.DefaultSubject {
			if d, ok := s.Quota(QuotaID(r.Name, rules.DefaultSubject)); ok && !idle(d) {
				claimB, claimR = d.CeilBurst, d.CeilRate
			}
		}
	})
	other := 1 - f
	if subject != rules.DefaultSubject {
		other = f
	}
	claimB, claimR = max(claimB, wholeB*other), max(claimR, wholeR*other)
	burst := min(c.Burst, max(wholeB-claimB, cur.Burst))
	rate := min(c.Rate, max(wholeR-claimR, cur.Rate))
	// Rounding alone (f*B + (1-f)*B need not be B exactly) never holds a
	// part back: the target stays the target, as configured before.
	if burst >= c.Burst-safeTol(wholeB) {
		burst = c.Burst
	}
	if rate >= c.Rate-safeTol(wholeR) {
		rate = c.Rate
	}
	if !(burst > safeTol(wholeB)) {
		if !exists {
			return fmt.Sprintf("rule %q: lease.default_share changed, and the other part of its subjects' budget still has larger leases outstanding; this part is leased once they have shrunk", r.Name)
		}
		burst = cur.Burst
	}
	if rate < lease.MinRate {
		rate = 0
	}
	if burst < c.Burst || rate < c.Rate {
		c.Burst, c.Rate = burst, rate
		c.MinSlice = min(c.MinSlice, rate)
		if c.MaxSlice != 0 {
			c.MaxSlice = max(c.MinSlice, min(c.MaxSlice, rate))
		}
	}
	return ""
}

// subjectsClaim is the largest ceiling (burst, rate) of rule's subjects'
// quotas with leases outstanding (every quota of the rule but the default
// one, def), cached per key (see subjectClaims).
func (n *Node) subjectsClaim(rule, def string, key claimKey) (burst, rate float64) {
	target := 1 - key.share
	n.claims.mu.Lock()
	e, ok := n.claims.m[rule]
	n.claims.mu.Unlock()
	if ok && e.key == key && (e.burst <= key.burst*target+safeTol(key.burst) && e.rate <= key.rate*target+safeTol(key.rate) ||
		time.Since(e.at) < splitClaimTTL) {
		return e.burst, e.rate
	}
	n.fsm.read(func(s *lease.State) {
		s.RangeQuotas(rule+"|", func(q lease.QuotaInfo) {
			if q.Name != def && !idle(q) {
				burst, rate = max(burst, q.CeilBurst), max(rate, q.CeilRate)
			}
		})
	})
	n.claims.mu.Lock()
	if n.claims.m == nil {
		n.claims.m = map[string]claimEntry{}
	}
	n.claims.m[rule] = claimEntry{key: key, burst: burst, rate: rate, at: time.Now()}
	n.claims.mu.Unlock()
	return burst, rate
}
