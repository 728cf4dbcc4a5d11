package sim

import (
	"strings"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/region"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// upstream is a regional group's lease from the global group for each
// funded quota, as internal/coordinator/upstream.go holds it (with safe
// shares 0, so no safe-share settling, and without nudges): a
// lease.Holding per quota on the leader's clock, demand flowing up as the
// sum of the subleases', nothing given back, a shrink confirmed once the
// quota's ceilings fit it, and a Fund entry after every answer.
type upstream struct {
	g      *group
	holder string
	seq    uint64
	quotas map[string]*upQuota
	retry  int64 // leader clock
	back   int64
	busy   bool // a request is out
}

type upQuota struct {
	id, rule, subject string
	h                 lease.Holding
	confCap, confRate float64
	earlyAt, earlyGap int64
	sentDemand        float64
	sentAt            int64
}

const (
	upstreamDrift = 0.001
	upstreamEarly = 50_000 // µs
	upstreamWant  = 1.1
	// upstreamHelped: an ask that grew the lease this much resets the
	// backoff of the asks (as the coordinator's upstream does).
	upstreamHelped = 1.5
	renewAtFrac    = 0.5
)

func newUpstream(g *group) *upstream {
	return &upstream{g: g, holder: region.HolderName(region.ID(g.s.regionName(g.region))), quotas: map[string]*upQuota{}}
}

// reset is a new term: the new leader starts from no upstream leases (the
// old ones lapse; their funding drops at NotAfter or at LeaderElected).
func (u *upstream) reset() {
	u.quotas = map[string]*upQuota{}
	u.retry, u.back, u.busy = 0, 0, false
}

func (u *upstream) clock() int64 { return u.g.nodes[u.g.leader].clock.at(u.g.s.now) }

func (u *upstream) round() {
	g, s := u.g, u.g.s
	if !g.ready || u.busy {
		return
	}
	now := u.clock()
	if now < u.retry {
		return
	}
	type info struct {
		q      lease.QuotaInfo
		demand float64
		live   int
	}
	state := map[string]info{}
	var ids []string
	s.apply.drain(g)
	stNow := g.st.Now()
	for _, id := range s.fundedIDs {
		q, ok := g.st.Quota(id)
		if !ok || !q.Funded {
			continue
		}
		fi := info{q: q}
		for _, l := range g.st.Leases(id) {
			if l.Expiry >= stNow {
				fi.demand += l.Demand
				fi.live++
			}
		}
		state[id] = fi
		ids = append(ids, id)
	}
	var grants, renews []*upQuota
	anyDue := false
	for _, id := range ids {
		fi := state[id]
		q := u.quotas[id]
		if q == nil {
			rule, subject, _ := strings.Cut(id, "|")
			q = &upQuota{id: id, rule: rule, subject: subject}
			q.h = lease.Holding{Quota: id, Validity: func(term int64) int64 { return lease.AgentValidity(term, upstreamDrift, 0) }}
			u.quotas[id] = q
		}
		if fi.live == 0 {
			continue
		}
		if !q.h.Valid(now) {
			if q.h.Lease.ID != 0 {
				q.h.Drop()
				q.confCap, q.confRate = 0, 0
			}
			anyDue = true
			grants = append(grants, q)
			continue
		}
		if coordinator.Fits(fi.q, q.h.Lease.Cap, q.h.Lease.Rate) {
			if q.h.Lease.Cap < q.confCap || q.h.Lease.Rate < q.confRate {
				anyDue = true
			}
			q.confCap, q.confRate = q.h.Lease.Cap, q.h.Lease.Rate
		}
		validity := lease.AgentValidity(q.h.Lease.Term, upstreamDrift, 0)
		if now >= q.h.ValidUntil-int64(float64(validity)*(1-renewAtFrac)) {
			anyDue = true
		}
		wants := fi.demand > upstreamWant*(fi.q.Rate+q.h.Lease.Rate)
		fell := coordinator.DemandFell(fi.demand, q.sentDemand)
		soon := now >= q.sentAt+upstreamEarly
		switch {
		case fell && soon:
			anyDue = true
		case wants && now >= q.earlyAt:
			anyDue = true
			q.earlyGap = min(max(2*q.earlyGap, upstreamEarly), validity/2)
			q.earlyAt = now + q.earlyGap
		case !wants:
			q.earlyGap = 0
		}
		renews = append(renews, q)
	}
	if !anyDue {
		return
	}
	// Sequence numbers continue across this group's leaders: at least the
	// leader's clock, as the real loop starts from the wall clock.
	u.seq = max(u.seq, uint64(max(now, 1)))
	req := &rationv1.RenewRequest{Holder: u.holder, Region: s.regionName(g.region), Seq: u.seq}
	seqs := make([]uint64, 0, len(grants)+len(renews))
	for i, q := range grants {
		seq := u.seq + uint64(i)
		demand := max(state[q.id].demand, state[q.id].q.Rate)
		q.h.Grant(now, u.holder, seq, demand)
		q.sentDemand, q.sentAt = demand, now
		seqs = append(seqs, seq)
		req.Items = append(req.Items, &rationv1.RenewItem{Quota: &rationv1.QuotaRef{Rule: q.rule, Subject: q.subject}, Demand: demand})
	}
	renewSeq := u.seq + uint64(len(grants))
	for _, q := range renews {
		it := q.h.Renewal(now, renewSeq, state[q.id].demand, 0)
		q.sentDemand, q.sentAt = it.Demand, now
		seqs = append(seqs, renewSeq)
		req.Items = append(req.Items, &rationv1.RenewItem{
			Quota: &rationv1.QuotaRef{Rule: q.rule, Subject: q.subject}, LeaseId: it.LeaseID,
			Unused: 0, Demand: it.Demand, ConfirmedCap: q.confCap, ConfirmedRate: q.confRate,
		})
	}
	u.seq = renewSeq + 1
	if len(req.Items) == 0 {
		return
	}
	u.busy = true
	term := g.term
	all := append(grants, renews...)
	s.call(g.leaderNode().ep(), s.global, req, nil, func(resp *rationv1.RenewResponse, _ *rationv1.ReleaseResponse, err error) {
		if g.term != term {
			return // a new leader started afresh
		}
		u.busy = false
		if err == nil && len(resp.GetGrants()) != len(req.Items) {
			err = errNotLeader
		}
		if err != nil {
			u.seq += 1e7
			u.back = min(max(2*u.back, us(s.cfg.UpstreamTick)), 1_000_000)
			u.retry = u.clock() + u.back
			return
		}
		u.back, u.retry = 0, 0
		recv := u.clock()
		var funds []lease.Command
		for i, q := range all {
			gr := resp.Grants[i]
			switch e := gr.GetError(); {
			case e == "":
				l := lease.Lease{ID: gr.LeaseId, Quota: q.id, Balance: gr.Balance, Cap: gr.Cap, Rate: gr.Rate, Term: gr.DurationUs}
				oldCap, oldRate := q.h.Lease.Cap, q.h.Lease.Rate
				if !q.h.Adopt(recv, seqs[i], l) {
					continue
				}
				if q.h.Lease.Rate > upstreamHelped*oldRate || q.h.Lease.Cap > upstreamHelped*oldCap {
					q.earlyGap, q.earlyAt = 0, q.sentAt+upstreamEarly
				}
				if q.h.Valid(recv) {
					rate := gr.Rate
					if rate < lease.MinRate {
						rate = 0
					}
					funds = append(funds, lease.Fund{Quota: q.id, Burst: gr.Cap, Rate: rate, Deposit: gr.Balance, NotAfter: q.h.ValidUntil})
				}
			default:
				q.h.Drop()
			}
		}
		if len(funds) > 0 {
			g.propose(funds, func(c *commit) {
				res := g.s.apply.wait(c)
				var funded []string
				for i, r := range res {
					if r.Err != nil {
						s.fail("%s: Fund %+v refused: %v", g.name, funds[i], r.Err)
					} else {
						funded = append(funded, funds[i].(lease.Fund).Quota)
					}
				}
				g.mark(funded, "")
			})
		}
	})
}
