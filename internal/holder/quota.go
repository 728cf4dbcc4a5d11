package holder

import (
	"sync"
	"sync/atomic"

	"github.com/ration-dev/ration/internal/lease"
)

// quota is one leased (rule, subject) of this agent.
type quota struct {
	rule    string
	subject string
	id      string // coordinator.QuotaID
	// burst and rate are the quota's shape as this agent's rules say
	// (the rule's B and r, times its split): no grant is adopted past
	// them (clampGrant).
	burst, rate float64
	// bound holds every grant to that shape (clampGrant).
	bound lease.GrantBound

	mu        sync.Mutex
	h         lease.Holding
	requested float64 // tokens asked for since the last sample (admitted or not)
	lastUsed  int64
	// recent is the smoothed demand of the closed sample windows, the last
	// of which ended at sampledAt (created: when the quota was).
	recent             float64
	sampledAt, created int64
	// demand is the last reported demand (tokens/s) and reportedAt when;
	// sinceReport the tokens asked for since then (admitted or not).
	demand      float64
	reportedAt  int64
	sinceReport float64
	// lump is how long the last delegate's count covered (µs; see
	// window).
	lump int64
	// Reasons to renew before the renew point: the leader nudged it, the
	// last answer shrank it (confirm at once, giving back the excess), or
	// a request found the slice dry.
	nudged, confirm, dry bool
	// sentAt is when a renewal was last sent; dryAt the earliest next ask
	// of a dry slice, and dryGap the current spacing of those asks,
	// doubled while they bring nothing.
	sentAt, dryAt int64
	dryGap        int64
	dryAsk        bool // the last request sent was a dry ask
	// sentNudged: the last request was sent because the leader nudged.
	sentNudged bool
	failed     string // an item error (unknown quota, invalid), logged once
	// failedAt is when; a quota the coordinator cannot ever accept
	// (invalid) is never asked again.
	failedAt  int64
	invalid   bool
	clamped   bool          // the last grant was held to the rule (clampGrant)
	ready     chan struct{} // closed once the first answer (grant or error) arrived
	readyOnce sync.Once
	// got is set when ready is closed: decisions test it (an atomic load)
	// instead of selecting on ready, which costs more on every decision.
	got atomic.Bool
	// coldUntil ends the cold start: until then (ColdStart after the quota
	// was added) a decision that finds no first answer yet waits for it.
	// It is one deadline for every decision of the quota, so decisions
	// that wait for several new quotas (a batch) wait out one cold start
	// in all, not one per quota.
	coldUntil int64
	// grantedAt is when the current lease's first grant was adopted (a
	// readiness check gives a lease granted empty up to ColdStart from
	// then to fill: see Fetched).
	grantedAt int64

	// With lease.default_share (see shared.go). own: this quota's own
	// lease is asked for (always, without a default share; for a subject
	// of a rule with one, once its copy of the default lease ran dry).
	own bool
	// ownUsed is when a decision last needed the own lease (its copy could
	// not pay); an own lease not needed for IdleAfter is given back.
	ownUsed int64
	// A subject's copy of its rule's default lease: cp mirrors every
	// command and answer of def's holding and is spent on this subject
	// alone. removed: forgotten by the loop (a decision that finds it
	// looks the subject up again).
	def     *quota
	cp      *lease.Holding
	removed bool
	// owesLess: cp owes less than def's holding (a shrink found it below
	// the new cap), so it may not be forgotten until the next command of
	// def's lease has given back the least of the two (see evictable).
	owesLess bool
	// The rule's default quota (subject rules.DefaultSubject): never spent
	// itself; copies are its subjects' copies (under its mu, which is
	// taken before theirs), and touched is when a subject last used it.
	isDefault bool
	copies    map[*quota]struct{}
	touched   atomic.Int64
}

func (q *quota) markReady() {
	q.readyOnce.Do(func() {
		q.got.Store(true)
		close(q.ready)
	})
}

// answered reports whether the first answer arrived.
func (q *quota) answered() bool { return q.got.Load() }

// demandAt estimates the demand at now: what was requested since the
// last sample, over at least demandWindow (the smoothed rate of earlier
// samples fills in the rest of it). It changes nothing; q.mu held.
func (q *quota) demandAt(now int64) float64 {
	if q.isDefault {
		// Every agent asks for the whole default part: its slice is spent
		// on each of its subjects, so the leader splits it evenly.
		return q.rate
	}
	el := now - q.sampledAt
	w := q.window()
	if el >= w {
		return q.requested / (float64(el) / 1e6)
	}
	return (q.requested + q.recent*float64(w-max(el, 0))/1e6) / (float64(w) / 1e6)
}

// window is the shortest window a demand is measured over: demandWindow,
// or two of a delegate's reporting intervals. An Envoy counts its
// requests in one lump per interval, so a shorter window is either a
// lump or nothing: read as a demand, the empty one handed the quota's
// rate to its other holders and emptied this agent's lease until the
// next lump.
func (q *quota) window() int64 {
	return max(demandWindow.Microseconds(), 2*q.lump)
}

// sample closes a measurement window once it is at least demandWindow long
// and holds a few requests (or has run for 8 windows): the rate it saw,
// averaged half and half with the earlier ones, becomes recent. So a busy
// subject's demand follows a change within about two windows, while a slow
// subject's is measured over long enough windows not to read as noise.
func (q *quota) sample(now int64) {
	if q.isDefault {
		return
	}
	el := now - q.sampledAt
	w := q.window()
	if el < w || q.requested < sampleRequests && el < 8*w {
		return
	}
	r := q.requested / (float64(el) / 1e6)
	if q.sampledAt == q.created {
		q.recent = r // the first window: nothing earlier to average with
	} else {
		q.recent = (q.recent + r) / 2
	}
	q.requested, q.sampledAt = 0, now
}

// report takes the demand to send at now, within what a renewal may carry
// (lease.MaxValue): a delegate's report may count up to 2^40 requests,
// and a demand past the bound made the coordinator refuse the quota's
// renewal as invalid, which lost its lease for every caller of the agent.
func (q *quota) report(now int64) float64 {
	d := min(q.demandAt(now), lease.MaxValue)
	q.demand, q.reportedAt, q.sinceReport = d, now, 0
	return d
}

// fellZ is how many standard deviations (of a Poisson count at the
// reported rate) the tokens asked for since a report must fall short by
// before the demand counts as fallen: an agent that reported 32/s and saw
// nothing for 250ms (8 expected, 0 seen), or one that reported 29/s and saw
// 10/s for half a second, has a new demand; a subject of a few requests a
// second has to be quiet for longer. Steady Poisson arrivals fall that
// short about once in 160 looks.
const fellZ = 2.5

// fell reports whether the demand fell to less than half of what was last
// reported, judged on the tokens asked for since that report (see fellZ;
// not on one window's count: a demand of 20/s brings 5 per window, and
// requiring 8 per window left such a fall unreported until the renew
// point). A fall restarts the estimate from what arrived since the
// report, so that the early renewal reports the new demand rather than a
// smoothed mix that keeps most of the old one for several windows (and
// would not look like a fall to the region's leader, which passes the sum
// upstream). q.mu held.
func (q *quota) fell(now int64) bool {
	el := now - q.reportedAt
	if q.isDefault || el < q.window() {
		return false
	}
	expected := q.demand * float64(el) / 1e6
	if miss := expected - q.sinceReport; q.sinceReport >= expected/2 || miss*miss < fellZ*fellZ*expected {
		return false
	}
	q.recent = q.sinceReport / (float64(el) / 1e6)
	q.requested, q.sampledAt = 0, now
	return true
}

// count records cost as asked for at now, admitted or not; q.mu held.
func (q *quota) count(cost float64, now int64) {
	q.requested += cost
	q.sinceReport += cost
	q.lastUsed = now
}

// drop forgets q's lease (and, for a default quota, every copy's); q.mu
// held.
func (q *quota) drop() {
	q.h.Drop()
	if q.isDefault {
		q.mirror((*lease.Holding).Drop)
	}
}

// copyRate is what q's copy of its rule's default lease refills per
// second, 0 without one; q.mu held. A subject's own lease is asked for
// the demand beyond it.
func (q *quota) copyRate() float64 {
	if q.cp == nil {
		return 0
	}
	return q.cp.Lease.Rate
}
