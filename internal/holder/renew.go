package holder

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/lease"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

const (
	// failedRetry spaces out asking again for a quota the coordinator did
	// not know.
	failedRetry = 10 * time.Second
	// maxBackoff caps the pause between failed Renew rounds. Leases live for
	// seconds, so a longer pause would let them lapse needlessly.
	maxBackoff = time.Second
	// demandWindow is the shortest window a demand is measured over: a
	// renewal soon after the last one blends in the previous estimate for
	// the rest of the window, so early renewals do not report noise.
	demandWindow = 250 * time.Millisecond
	// rescan bounds the time between two scans of every quota (idle
	// detection, demands that fell); renew points, nudges, dry slices and
	// new quotas trigger looks of their own.
	rescan = 250 * time.Millisecond
	// sampleRequests is how many requests a demand window must hold to be
	// closed before 8 windows have passed.
	sampleRequests = 8
	// confirmShrink is the part of a lease's rate or cap (or its owed
	// tokens, of its cap) a shrink must free to be confirmed at once
	// without a nudge.
	confirmShrink = 0.15
	// dryHelped is how much a dry ask must grow a lease to count as having
	// helped (its backoff starts over).
	dryHelped = 1.5
	// itemBytes estimates one renew item's encoded size beyond its rule and
	// subject, for splitting requests by size.
	itemBytes = 64
)

// pick is what one look found to send.
type pick struct {
	grants, renews []*quota
	idle           []*quota
	// demote: subjects whose copy of the default lease has paid for every
	// decision for a while (demoteAfter): their own leases go back.
	demote []*quota
}

// look sorts qs at now into new quotas (grants), quotas due at their renew
// point, quotas that may renew early, and idle ones. When anything is at
// its renew point, the quotas not due yet fill the rest of the round's
// last request, the soonest due first (piggyback): one renewal per agent
// per period, not per quota, for up to MaxItems quotas. It returns the
// earliest time a quota it left alone wants looking at again (at most
// next).
func (l *Leases) look(qs []*quota, full bool, now, next int64) (pick, int64) {
	var p pick
	var rest []restQuota
	anyDue := false
	// Fresh and flagged quotas may repeat (a quota flagged twice); a full
	// scan's snapshot holds each once and may hold 100,000 of them, so it
	// skips the set.
	var seen map[*quota]bool
	if !full {
		seen = make(map[*quota]bool, len(qs))
	}
	for _, q := range qs {
		if seen != nil {
			if seen[q] {
				continue
			}
			seen[q] = true
		}
		q.mu.Lock()
		idle := now-max(q.lastUsed, q.touched.Load()) > l.o.IdleAfter.Microseconds()
		if idle && q.isDefault && len(q.copies) > 0 {
			// Its subjects' copies still mirror it: it goes after them
			// (once full again), and is renewed like a lease in use
			// meanwhile, or it would lapse and take their balances (and
			// the debts that keep them) with it.
			idle = false
		}
		switch {
		case idle && q.evictable(now):
			p.idle = append(p.idle, q)
		case !q.own:
			// A subject spending only its copy of the default lease:
			// nothing to ask the coordinator.
		case q.def != nil && !q.invalid && q.h.Lease.ID != 0 && now-q.ownUsed > l.demoteAfter(q):
			p.demote = append(p.demote, q)
		case q.invalid:
		case q.failed != "" && now-q.failedAt < failedRetry.Microseconds():
			// The coordinator refused this quota; ask again later in case
			// its rules change.
			next = min(next, q.failedAt+failedRetry.Microseconds())
		case q.h.Lease.ID == 0:
			p.grants = append(p.grants, q)
		default:
			q.sample(now)
			if q.dry && !(q.demandAt(now) > q.h.Lease.Rate) {
				q.dry = false // a burst, not a demand above the share
			}
			renewAt := l.renewAt(q)
			// A demand that fell to half of what was reported is worth
			// telling at once: another holder may want what this one no
			// longer does (a rise shows up as a dry slice instead).
			fell := q.fell(now)
			// A shrink is confirmed at once; a nudge or a fallen demand
			// at most every EarlyGap; a dry slice asks with a backoff of
			// its own (dryAt), so that asking in vain never delays the
			// others.
			var at int64 = math.MaxInt64
			if q.confirm {
				at = now
			}
			if q.nudged || fell {
				at = min(at, q.sentAt+l.o.EarlyGap.Microseconds())
			}
			if q.dry {
				at = min(at, q.dryAt)
			}
			switch {
			case now >= renewAt:
				anyDue = true
				p.renews = append(p.renews, q)
			case now >= at:
				p.renews = append(p.renews, q)
			default:
				rest = append(rest, restQuota{q, renewAt})
				next = min(next, renewAt, at)
			}
		}
		q.mu.Unlock()
	}
	if anyDue {
		p.renews = l.piggyback(p.renews, rest, len(p.grants)+len(p.renews))
	}
	return p, next
}

// restQuota is a quota a look found not due yet, and its renew point.
type restQuota struct {
	q       *quota
	renewAt int64
}

// piggyback appends to renews the quotas of rest that fit in the last
// request of a round of n items (MaxItems each), the soonest due first.
// With up to MaxItems quotas that is all of them, as every renewal then
// costs one request whatever it carries. Past that, renewing every quota
// whenever any was due renewed each of them once per round, not once per
// period: with 100,000 quotas and fresh ones added all the time, some
// quota was always due, every round sent all of them (100 requests, one
// after another), and a round outlasted the time between a renew point
// and expiry on a loaded coordinator, so leases expired before their
// renewals were sent and their decisions fell to the failure policy.
func (l *Leases) piggyback(renews []*quota, rest []restQuota, n int) []*quota {
	room := (l.maxItems - n%l.maxItems) % l.maxItems
	if room < len(rest) {
		slices.SortStableFunc(rest, func(a, b restQuota) int { return cmp.Compare(a.renewAt, b.renewAt) })
		rest = rest[:room]
	}
	for _, r := range rest {
		renews = append(renews, r.q)
	}
	return renews
}

// rescan is the time between two scans of every quota: rescan, and longer
// (up to a second) for an agent with more than 10,000 quotas, so that the
// scans cost about the same per second whatever the count.
func (l *Leases) rescan() time.Duration {
	l.mu.Lock()
	n := l.count
	l.mu.Unlock()
	return min(time.Second, rescan*time.Duration(max(1, n/10000)))
}

// renewAt is the renew point of the validity of q's last answer; q.mu held.
func (l *Leases) renewAt(q *quota) int64 {
	return q.h.ValidUntil - int64(float64(l.validity(q.h.Lease.Term))*(1-l.o.RenewAt))
}

// round renews what is due, split into requests within MaxItems and
// MaxRequestBytes, sent one after another (a holder's sequence numbers
// must reach the leader in order); quotas that appear meanwhile are
// granted in the next request of the round, not after it. It scans every
// quota only at nextScan; otherwise it looks at new and flagged ones.
func (l *Leases) round(ctx context.Context) {
	now := l.Now()
	// Local bookkeeping, due whatever the coordinators answer: not held
	// back by a backoff.
	l.repayHeld(now)
	if now < l.retryAt {
		return
	}
	fresh, early := l.takeFresh(), l.takeEarly()
	var p pick
	if now >= l.nextScan {
		p, l.nextScan = l.look(l.snapshot(), true, now, now+l.rescan().Microseconds())
	} else {
		var next int64
		p, next = l.look(append(fresh, early...), false, now, l.nextScan)
		if next < l.nextScan {
			l.nextScan = next
		}
	}
	if len(p.idle) > 0 {
		rctx, cancel := l.callCtx(ctx)
		l.release(rctx, p.idle)
		cancel()
		l.remove(p.idle)
	}
	if len(p.demote) > 0 {
		l.demote(ctx, p.demote, now)
	}
	queued := make(map[*quota]bool, len(p.grants)+len(p.renews))
	for _, q := range p.grants {
		queued[q] = true
	}
	for _, q := range p.renews {
		queued[q] = true
	}
	grants, renews := p.grants, p.renews
	for len(grants)+len(renews) > 0 {
		var added []*quota
		for _, q := range l.takeFresh() {
			if !queued[q] {
				queued[q] = true
				added = append(added, q)
			}
		}
		if len(added) > 0 {
			// Ahead of the rest in one copy: prepending them one at a
			// time is quadratic, and a burst of 100,000 new subjects
			// stalled the loop (no request sent for the whole burst).
			grants = append(added, grants...)
		}
		var g, r []*quota
		g, r, grants, renews = l.split(grants, renews)
		ok, finer := l.send(ctx, g, r)
		if finer {
			// Refused as too large: the same quotas again, in smaller
			// requests, at once.
			grants, renews = append(g, grants...), append(r, renews...)
			continue
		}
		if !ok {
			// Back off; everything is looked at again then.
			for _, q := range grants {
				q.markReady()
			}
			l.nextScan = l.retryAt
			return
		}
	}
}

// split takes the next request's quotas, up to MaxItems items and about
// MaxRequestBytes. While both wait, renewals take up to half of the items
// first, grants the room left, renewals what grants leave: a flood of new
// subjects (a grant each, a caller waiting on each) must not hold the
// renewals of leases in use back until those leases expire and their
// decisions fall to the failure policy; nor may a round of many renewals
// keep a first decision waiting past its first-grant timeout. Within a
// request the grants still come first on the wire (send).
func (l *Leases) split(grants, renews []*quota) (g, r, restG, restR []*quota) {
	n, size := 0, 64
	fits := func(q *quota) bool {
		sz := itemBytes + len(q.rule) + len(q.subject)
		if n > 0 && (n >= l.maxItems || size+sz > l.o.MaxRequestBytes) {
			return false
		}
		n, size = n+1, size+sz
		return true
	}
	first := len(renews)
	if len(grants) > 0 {
		first = min(first, max(1, l.maxItems/2))
	}
	j := 0
	for j < first && fits(renews[j]) {
		j++
	}
	i := 0
	for i < len(grants) && fits(grants[i]) {
		i++
	}
	for j < len(renews) && fits(renews[j]) {
		j++
	}
	return grants[:i], renews[:j], grants[i:], renews[j:]
}

// send sends one Renew for grants and renews and adopts its answers. It
// reports false when the request failed (the caller backs off), and finer
// when the coordinator refused it whole while it had several items (the
// caller sends them again in smaller requests).
func (l *Leases) send(ctx context.Context, grants, renews []*quota) (ok, finer bool) {
	now := l.Now()
	// New grants first: the coordinator gives them seq, seq+1, ... in item
	// order and the renewals the next number.
	req := &rationv1.RenewRequest{Holder: l.name, Region: l.o.Region, Seq: l.seq}
	seqs := make([]uint64, 0, len(grants)+len(renews))
	for i, q := range grants {
		seq := l.seq + uint64(i)
		q.mu.Lock()
		// A new lease asks for at least the whole rate: a demand measured
		// before the key existed says nothing, and the coordinator gives a
		// lone holder all of it anyway.
		demand := max(q.report(now)-q.copyRate(), q.rate)
		q.h.Grant(now, l.name, seq, demand)
		if q.isDefault {
			q.mirror(func(c *lease.Holding) { c.Grant(now, l.name, seq, demand) })
		}
		q.nudged, q.confirm = false, false
		q.mu.Unlock()
		seqs = append(seqs, seq)
		req.Items = append(req.Items, &rationv1.RenewItem{
			Quota: &rationv1.QuotaRef{Rule: q.rule, Subject: q.subject}, Demand: demand,
		})
	}
	renewSeq := l.seq + uint64(len(grants))
	for _, q := range renews {
		q.mu.Lock()
		dryAsk := q.dry && !q.nudged && !q.confirm
		q.sentNudged = q.nudged
		demand := max(0, q.report(now)-q.copyRate())
		it := q.h.Renewal(now, renewSeq, demand, 0)
		if q.isDefault {
			// Give back only what every copy gives back.
			// Confirm no less than a copy has lent (a held spend): its
			// delegate may spend that under the older, larger cap.
			q.mirror(func(c *lease.Holding) {
				ci := c.Renewal(now, renewSeq, demand, 0)
				it.Unused = min(it.Unused, ci.Unused)
				it.ConfirmedCap = max(it.ConfirmedCap, ci.ConfirmedCap)
			})
		}
		// What is given back may be granted again: the deposit budget
		// (clampGrant) counts it as never received.
		q.bound.Credit(it.Unused, q.burst)
		q.dryAsk = dryAsk
		q.nudged, q.confirm, q.dry = false, false, false
		q.sentAt = now
		q.dryAt = now + max(q.dryGap, l.o.EarlyGap.Microseconds())
		q.mu.Unlock()
		seqs = append(seqs, renewSeq)
		req.Items = append(req.Items, &rationv1.RenewItem{
			Quota: &rationv1.QuotaRef{Rule: q.rule, Subject: q.subject}, LeaseId: it.LeaseID,
			Unused: it.Unused, Demand: it.Demand, ConfirmedCap: it.ConfirmedCap, ConfirmedRate: it.ConfirmedRate,
		})
	}
	if len(req.Items) == 0 {
		return true, false
	}
	l.seq = renewSeq + 1

	if l.o.Logger.Enabled(ctx, slog.LevelDebug) {
		for _, it := range req.Items {
			l.o.Logger.Debug("lease renewal", "rule", it.Quota.GetRule(), "lease_id", it.LeaseId, "demand", it.Demand, "unused", it.Unused)
		}
	}
	// The holder's clock times the call: one reading fewer than time.Now
	// and time.Since, and the answer's receive time (recv) besides.
	start := l.Now()
	rctx, cancel := l.callCtx(ctx)
	resp, err := l.o.Client.Renew(rctx, req)
	cancel()
	recv := l.Now()
	l.m.renewDuration.Observe(float64(recv-start) / 1e6)
	if err != nil || len(resp.GetGrants()) != len(req.Items) {
		if err == nil {
			err = fmt.Errorf("coordinator answered %d grants for %d items", len(resp.GetGrants()), len(req.Items))
		}
		l.m.renewed("error").Inc()
		if status.Code(err) == codes.InvalidArgument && len(req.Items) > 1 {
			// Refused whole: most likely more items than this coordinator
			// takes (its -max-items is below ours). Split finer.
			l.maxItems = max(1, len(req.Items)/2)
			l.o.Logger.Warn("coordinator refused a lease request; splitting requests finer", "items", len(req.Items), "max_items", l.maxItems, "err", err)
			return false, true
		}
		switch status.Code(err) {
		case codes.OutOfRange:
			// Numbered past what the coordinator admits (this clock runs
			// ahead of its by more than lease.StaleMargin): not a request
			// too large; its clock catches up, and the retry passes.
			l.o.Logger.Warn("lease request refused: its sequence number is ahead of the coordinator's clock (check the clocks)", "seq", req.Seq, "err", err)
		case codes.FailedPrecondition:
			// Refused as stale: a number at or past ours was applied for
			// this holder (someone acting as it, or a lost reply's later
			// request). Nothing of this request was; move past every
			// number a coordinator admits, or every request stays stale.
			next := lease.PastStale(l.seq, l.o.wallMicros())
			l.o.Logger.Warn("lease request refused as stale; numbering past it", "seq", req.Seq, "next_seq", next, "err", err)
			l.seq = next
		}
		l.lastErr.Store(err.Error())
		l.backoff = min(max(2*l.backoff, l.o.Tick), maxBackoff)
		l.retryAt = l.Now() + l.backoff.Microseconds()
		if l.down.CompareAndSwap(0, time.Now().UnixNano()) {
			l.o.Logger.Warn("lease renewal failing: leases are spent until they expire, then failure policies apply", "err", err)
		}
		// The cold-start waiters learn there is nothing to wait for.
		for _, q := range grants {
			q.markReady()
		}
		return false, false
	}
	l.m.renewed("ok").Inc()
	l.linked.Store(true)
	l.backoff, l.retryAt = 0, 0
	if d := l.down.Swap(0); d != 0 {
		l.o.Logger.Info("lease renewals succeeding again", "failed_for", time.Since(time.Unix(0, d)).Round(time.Millisecond))
	}
	// A new slice: appending to grants, a part of the round's list, would
	// write the renewals over the grants still to be sent.
	for i, q := range slices.Concat(grants, renews) {
		l.adopt(q, seqs[i], resp.Grants[i], recv)
		q.mu.Lock()
		if q.h.Lease.ID != 0 {
			l.nextScan = min(l.nextScan, l.renewAt(q))
		}
		q.mu.Unlock()
	}
	return true, false
}

func (l *Leases) adopt(q *quota, seq uint64, g *rationv1.Grant, now int64) {
	ready := true
	defer func() {
		if ready {
			q.markReady()
		}
	}()
	q.mu.Lock()
	defer q.mu.Unlock()
	switch e := g.GetError(); {
	case e == "":
		q.failed = ""
		oldCap, oldRate, oldID := q.h.Lease.Cap, q.h.Lease.Rate, q.h.Lease.ID
		nl := lease.Lease{ID: g.LeaseId, Quota: q.id, Balance: g.Balance, Cap: g.Cap, Rate: g.Rate, Term: g.DurationUs}
		l.clampGrant(q, &nl, now)
		if !q.h.Adopt(now, seq, nl) {
			return
		}
		if q.h.Lease.ID != oldID {
			q.grantedAt = now
		}
		if q.isDefault {
			q.mirror(func(c *lease.Holding) { c.Adopt(now, seq, nl) })
		}
		l.m.granted.Add(g.Balance)
		shrunk := q.h.Lease.Cap < oldCap || q.h.Lease.Rate < oldRate || q.h.Owed > 0
		big := q.h.Lease.Cap < (1-confirmShrink)*oldCap || q.h.Lease.Rate < (1-confirmShrink)*oldRate || q.h.Owed > confirmShrink*q.h.Lease.Cap
		if shrunk && (big || q.sentNudged) {
			// A shrink is counted at the old size until confirmed: confirm
			// it at once (giving back the excess) so the rate it frees
			// reaches whoever wants it in a round trip: when the leader
			// asked for it (a nudge: someone is below its share), or when
			// it frees enough to matter. A small shrink the holder was not
			// asked for is confirmed at its next renewal: shares move by a
			// few percent with every noisy demand report, and confirming
			// each of them at once made every renewal answer trigger
			// another request (the simulator, internal/sim, measured 3x
			// the requests under contention).
			q.confirm = true
			l.mu.Lock()
			l.early = append(l.early, q)
			l.mu.Unlock()
			l.kick()
		}
		switch {
		case q.h.Lease.Rate > oldRate*dryHelped || q.h.Lease.Cap > oldCap*dryHelped:
			// Asking helped: ask again as soon as needed. Only a real gain
			// counts: a contended quota's share wanders by a few percent
			// with the holders' demand reports, and resetting on that kept
			// every holder of it asking every EarlyGap.
			q.dryGap = 0
		case q.dryAsk:
			// Asking brought nothing (the quota is contended and this is
			// the fair share): ask less often, down to the renew point;
			// the leader nudges when something frees up.
			q.dryGap = min(2*max(q.dryGap, l.o.EarlyGap.Microseconds()), l.validity(q.h.Lease.Term)/2)
		}
		q.dryAt = q.sentAt + max(q.dryGap, l.o.EarlyGap.Microseconds())
		if l.unusable(q, now) {
			ready = false
		}
	case strings.HasPrefix(e, itemErrLeaseExpired), strings.HasPrefix(e, itemErrRetryGrant):
		q.drop()
		l.m.expired.Inc()
		if !q.answered() {
			// A first grant whose answer was lost: its request was sent
			// again after an attempt timed out (a Raft entry of a thousand
			// grants on a loaded coordinator), and a retry is answered only
			// its last command. The lease exists; it is asked for again at
			// the next round, and the quota's first decisions keep waiting
			// for it within their cold start. Marked answered, they fell to
			// the failure policy at once, a whole request's worth (1,000
			// fresh subjects) on a healthy coordinator.
			ready = false
			l.mu.Lock()
			l.early = append(l.early, q)
			l.mu.Unlock()
			l.kick()
		}
	case strings.HasPrefix(e, itemErrInvalid):
		// Refused alone, and would be again: stop asking for it; its
		// decisions take the rule's failure policy.
		q.drop()
		q.invalid = true
		q.failed, q.failedAt = e, now
		l.o.Logger.Error("coordinator refused a leased quota as invalid: its failure policy applies", "rule", q.rule, "err", e)
	default:
		// Unknown quota, too many subjects, or an error this build does not
		// know: the quota's decisions take the failure policy; ask again
		// after failedRetry in case the coordinator's rules change.
		q.drop()
		if q.failed == "" {
			l.o.Logger.Error("coordinator refused a leased quota: its failure policy applies", "rule", q.rule, "err", e)
		}
		q.failed, q.failedAt = e, now
	}
}

// unusable reports whether q's first grant, just adopted, cannot pay one
// token while its cold start lasts, and then asks again at once: its
// first decisions keep waiting (up to the cold start) for a grant that
// can. Such a grant is a subject's lease on an agent that was just
// (re)started: the agents that served the subject so far hold its whole
// quota, sized when they alone asked, and the leader nudges them to give
// back the newcomer's share, which takes a round trip or two. Answered
// at once, the subject's first requests there were refused (429) though
// it was far under its budget. Only a default-share subject's own lease
// waits so, the one asked for because the subject needs more than its
// copy pays: a default quota's copies refill from the rate it was given,
// and the first grant of any other quota that comes back empty is the
// quota's own state (a subject that spent its budget, forgotten for
// idleness and asked for again), answered at once. q.mu held.
func (l *Leases) unusable(q *quota, now int64) bool {
	if q.def == nil || q.answered() || q.isDefault || q.h.Balance >= 1 || now >= q.coldUntil {
		return false
	}
	q.dry, q.dryAt = true, now
	l.mu.Lock()
	l.early = append(l.early, q)
	l.mu.Unlock()
	l.kick()
	return true
}

// release returns the balance of qs and stops spending them, in requests
// within MaxItems.
func (l *Leases) release(ctx context.Context, qs []*quota) {
	for len(qs) > 0 {
		k := min(len(qs), l.o.MaxItems)
		l.releaseOnce(ctx, qs[:k])
		qs = qs[k:]
	}
}

func (l *Leases) releaseOnce(ctx context.Context, qs []*quota) {
	req := &rationv1.ReleaseRequest{Holder: l.name, Seq: l.seq}
	now := l.Now()
	for _, q := range qs {
		q.mu.Lock()
		if q.h.Lease.ID == 0 {
			q.mu.Unlock()
			continue
		}
		if q.lending() {
			// A delegate (an Envoy RLQS assignment) may still spend what
			// was lent to it: a release would end the lease's reservation
			// under it. Spending stops here; the lease expires instead,
			// and its tokens are forfeit.
			q.h.Balance, q.h.Owed, q.h.ValidUntil = 0, 0, min(q.h.ValidUntil, now)
			q.mu.Unlock()
			l.m.unreleased.Inc()
			continue
		}
		seq := req.Seq + uint64(len(req.Items))
		rel := q.h.Release(now, l.name, seq)
		if q.isDefault {
			q.mirror(func(c *lease.Holding) { rel.Unused = min(rel.Unused, c.Release(now, l.name, seq).Unused) })
		}
		q.mu.Unlock()
		req.Items = append(req.Items, &rationv1.RenewItem{
			Quota: &rationv1.QuotaRef{Rule: q.rule, Subject: q.subject}, LeaseId: rel.LeaseID, Unused: rel.Unused,
		})
		l.m.returned.Add(rel.Unused)
	}
	if len(req.Items) == 0 {
		return
	}
	l.seq += uint64(len(req.Items))
	if _, err := l.o.Client.Release(ctx, req); err != nil {
		// The tokens are forfeit, not double-spent: Release stopped the
		// local spending before the call.
		l.o.Logger.Warn("lease release failed; unused tokens are lost until the leases expire", "err", err, "leases", len(req.Items))
	}
}

// lending reports whether a delegate may still spend tokens or a rate
// lent from q's lease: its own loans, or, for a rule's default quota, a
// copy's (a held spend of a subject); q.mu held.
func (q *quota) lending() bool {
	if q.h.Lent > 0 || q.h.LentRate > 0 {
		return true
	}
	if !q.isDefault {
		return false
	}
	for c := range q.copies {
		c.mu.Lock()
		lent := c.cp != nil && c.def == q && c.cp.Lent > 0
		c.mu.Unlock()
		if lent {
			return true
		}
	}
	return false
}

// clampGrant holds a grant to the quota's shape in this agent's rules
// (lease.GrantBound: the lease's cap and rate, and the tokens deposited,
// whatever a coordinator answers); the Holding owes back what it holds
// past the cap, at the next renewal. Clamps are counted, and logged once
// per quota until a grant fits again. q.mu held.
func (l *Leases) clampGrant(q *quota, nl *lease.Lease, now int64) {
	l.refreshShape(q)
	granted := *nl
	if !q.bound.Clamp(now, q.burst, q.rate, nl) {
		q.clamped = false
		return
	}
	l.m.clamped.Inc()
	if !q.clamped {
		l.o.Logger.Warn("a coordinator granted more than the rule allows: held to the rule (check that the agent's coordinators are its group's, with the same rules)",
			"rule", q.rule, "quota", q.id, "granted_cap", granted.Cap, "granted_rate", granted.Rate, "granted_tokens", granted.Balance,
			"burst", q.burst, "rate", q.rate)
	}
	q.clamped = true
}

// refreshShape reads q's shape from the agent's current rules (a reload
// may have changed the rule's burst or rate). q.mu held.
func (l *Leases) refreshShape(q *quota) {
	if l.o.Rules == nil {
		return
	}
	set := l.o.Rules()
	if set == nil {
		return
	}
	r, ok := set.Rule(q.rule)
	if !ok {
		return
	}
	f := r.Lease.Split(q.subject)
	q.burst, q.rate = r.Burst*f, r.Rate*f
}
