package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/region"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// The upstream side of a regional group (-upstream): while this node leads,
// it holds one lease from the global group per funded quota (every scope:
// global, mode: leased quota its agents asked for), under the holder name
// region.HolderName(-region), and links each to its quota with a Fund entry:
// the quota's capacity becomes its safe share plus the lease, the lease's
// tokens go into the pool, and no sublease outlives the lease's validity.
// It is the agents' holder protocol (lease.Holding), with three differences:
//
//   - Demand is the sum of the subleases' reported demands: demand flows up.
//   - It gives nothing back (Unused 0): the pool is its bucket, and what is in
//     it may already be subleased. A holder may always give back nothing.
//   - It confirms a shrink only once the quota's ceilings fit the new size,
//     that is once no sublease can still be spending under the old one; until
//     then the global group keeps the old size reserved.
//
// Cut off from the global group, the Fund entries stop: the funding drops
// at its NotAfter by itself, and the quota is back to its safe share.

const (
	upstreamTick = 20 * time.Millisecond
	// upstreamDrift is rho for upstream leases (as for agents: 1000 ppm).
	upstreamDrift = 0.001
	// upstreamRetryUnknown spaces out asking again for a quota the global
	// group does not know.
	upstreamRetryUnknown = 10 * time.Second
	// upstreamEarly spaces out early renewals of one upstream lease: when
	// the global group nudges it, or when the subleases want more than the
	// quota has (demand flows up in round trips, not in lease periods).
	upstreamEarly = 50 * time.Millisecond
	// upstreamWant is how far the subleases' demand must exceed the quota's
	// capacity before the region asks for more ahead of its renew point.
	upstreamWant = 1.1
	// upstreamHelped is the growth of an upstream lease that counts as an
	// ask having helped (resetting earlyGap); a contended quota's share
	// wanders by a few percent with every demand report.
	upstreamHelped = 1.5
	// upstreamFell is the fall of the subleases' summed demand, against the
	// demand last reported, that is told at once. Not a half, as an
	// agent's own fall must be: a region's sum moves in the steps its
	// agents report (an agent's estimate decays towards a new rate over
	// several renewals, some of them nudged), and a region that reported a
	// step of the way down (80 -> 25/s) would never see the rest (25 -> 14)
	// as a halving: the global group kept its share at 25 until the renew
	// point, 5s later, while another region wanted it.
	upstreamFell = 0.75
)

// demandFell reports whether a region's summed demand fell far enough
// below the demand it last reported upstream (sent) to tell the global
// group ahead of its renew point.
func demandFell(demand, sent float64) bool { return demand < upstreamFell*sent }

// upQuota is one funded quota's upstream lease.
type upQuota struct {
	id, rule, subject string
	h                 lease.Holding
	// confCap, confRate are the upstream sizes the quota fits within now:
	// what the next renewal confirms.
	confCap, confRate float64
	failedAt          int64 // when the global group refused it (0: never)
	// earlyAt is the earliest next early renewal; earlyGap its spacing for
	// demand-driven asks, doubled while they bring nothing.
	earlyAt  int64
	earlyGap int64
	// sentDemand is the demand the last renewal reported, sentAt when.
	sentDemand float64
	sentAt     int64
	// bound holds every grant to the rule (clampUpstream).
	bound lease.GrantBound
}

// UpstreamEnv is what the upstream loop needs from the node that leads:
// the real node's (nodeUpstream), or internal/sim's model of one, which
// runs this loop's rounds rather than a copy of them.
type UpstreamEnv interface {
	// Now reads the term's clock (µs): the upstream holdings run on it.
	Now() int64
	// Read calls f with the state machine's state (read only, not kept).
	Read(f func(*lease.State))
	// Renew calls the global group, bounded in time.
	Renew(req *rationv1.RenewRequest) (*rationv1.RenewResponse, error)
	// Propose commits cmds as one entry of this term: their results, or
	// an error when the entry did not commit in this term.
	Propose(cmds []lease.Command) ([]OpResult, error)
	// Funded tells the nudge planner of the quotas a Fund changed.
	Funded(quotas []string)
	// Ended reports whether the term is over.
	Ended() bool
	// RenewAt is the renew point of rule's upstream leases (a fraction of
	// their validity).
	RenewAt(rule string) float64
	// SafeShare is rule's safe share in this region as learned from the
	// global group (else the rules file's), and the own part of a funded
	// quota at that safe share; ok false when the rules have no such rule.
	SafeShare(rule string) (safe float64, own region.Share, ok bool)
	// Shape is the burst and rate this group's rules give the quota of
	// (rule, subject), the most an upstream grant of it may carry; ok
	// false when the rules have no such rule.
	Shape(rule, subject string) (burst, rate float64, ok bool)
	// Clamped counts an upstream grant held to the rule.
	Clamped()
	// LearnedSafe is the safe share of rule this group's state holds as
	// learned from the global group (nil: none).
	LearnedSafe(rule string) *float64
	// Renewed counts one upstream renewal, by its result (err nil: it
	// was answered), for the metrics and the status page.
	Renewed(err error)
	Logger() *slog.Logger
}

// Upstream is one term's upstream loop state (see the top of this file);
// Round is one turn of the loop.
type Upstream struct {
	env    UpstreamEnv
	region string
	holder string
	seq    uint64
	quotas map[string]*upQuota
	retry  int64 // no request before this (backoff), term clock µs
	back   time.Duration
	// sentSafe is the confirmable safe share per rule last sent and
	// answered.
	sentSafe map[string]float64
	// nudged are the quotas the global leader asked to renew at once,
	// filled by the Watch stream's goroutine.
	nudgeMu sync.Mutex
	nudged  map[string]bool
}

// NewUpstream starts a term's upstream loop state for region (-region),
// with its first sequence number.
func NewUpstream(env UpstreamEnv, regionName string, seq uint64) *Upstream {
	return &Upstream{
		env: env, region: regionName, holder: region.HolderName(region.ID(regionName)),
		seq: seq, quotas: map[string]*upQuota{}, nudged: map[string]bool{},
	}
}

func (u *Upstream) nudge(refs []*rationv1.QuotaRef) {
	u.nudgeMu.Lock()
	defer u.nudgeMu.Unlock()
	for _, r := range refs {
		u.nudged[QuotaID(r.GetRule(), r.GetSubject())] = true
	}
}

func (u *Upstream) takeNudged() map[string]bool {
	u.nudgeMu.Lock()
	defer u.nudgeMu.Unlock()
	m := u.nudged
	u.nudged = map[string]bool{}
	return m
}

// termClock is the term's clock without the node's max(last stamp): the
// upstream holdings run on it, so their NotAfter is never later than the
// stamps the subleases' terms are measured from.
func (n *Node) termClock(t *term) int64 {
	return t.base + n.clock().Sub(t.start).Microseconds()
}

// UpstreamSeqStart is the first sequence number of the term's upstream
// requests. Numbers continue across leaders of this group, past every
// number whose answer a Fund in this group's state applied (the Barrier
// and LeaderElected before the loop starts put every earlier term's
// committed Fund in the state). A number an earlier leader sent but never
// funded may be reused: the global group then either refuses it (stale) or
// replays its answer, which this leader funds once, as the earlier one never
// did. The term's clock (never below the wall clock at the term's start)
// keeps numbers apart from an earlier leader's unfunded ones in the common
// case, so that few requests are refused as stale.
func UpstreamSeqStart(env UpstreamEnv) uint64 {
	var funded uint64
	env.Read(func(s *lease.State) { funded = s.UpstreamSeq() })
	return max(uint64(env.Now()), funded+1)
}

// runUpstream is the term's upstream loop (regional groups only).
func (n *Node) runUpstream(t *term) {
	defer n.wg.Done()
	env := nodeUpstream{n: n, t: t}
	u := NewUpstream(env, n.cfg.Region, UpstreamSeqStart(env))
	// The global leader's nudges: shares between regions move in round
	// trips. The stream ends with the term.
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		_ = n.upClient.Watch(t.ctx, u.holder, u.nudge)
	}()
	tk := time.NewTicker(upstreamTick)
	defer tk.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tk.C:
		}
		u.Round()
	}
}

// nodeUpstream is the real node's UpstreamEnv for term t.
type nodeUpstream struct {
	n *Node
	t *term
}

func (e nodeUpstream) Now() int64                { return e.n.termClock(e.t) }
func (e nodeUpstream) Read(f func(*lease.State)) { e.n.fsm.read(f) }
func (e nodeUpstream) Funded(quotas []string)    { e.n.rebalance(quotas, "") }
func (e nodeUpstream) Ended() bool               { return e.t.ctx.Err() != nil }
func (e nodeUpstream) Logger() *slog.Logger      { return e.n.logger }

func (e nodeUpstream) Renew(req *rationv1.RenewRequest) (*rationv1.RenewResponse, error) {
	ctx, cancel := context.WithTimeout(e.t.ctx, 2*time.Second)
	defer cancel()
	return e.n.upClient.Renew(ctx, req)
}

func (e nodeUpstream) Propose(cmds []lease.Command) ([]OpResult, error) {
	p := &proposal{}
	for _, c := range cmds {
		p.ops = append(p.ops, pendingOp{cmd: c})
	}
	return e.n.proposeIn(e.t.ctx, e.t, p)
}

func (e nodeUpstream) RenewAt(rule string) float64 {
	if t := e.n.tuningOf(rule, e.n.cfg.Region); t.RenewAt != 0 {
		return t.RenewAt
	}
	return e.n.cfg.UpstreamRenewAt
}

func (e nodeUpstream) SafeShare(rule string) (float64, region.Share, bool) {
	r, ok := e.n.rules.Load().Rule(rule)
	if !ok {
		return 0, region.Share{}, false
	}
	v := e.n.learnedSafe(r)
	return v, region.Safe(r.Burst, r.Rate, v), true
}

func (e nodeUpstream) Shape(rule, subject string) (float64, float64, bool) {
	r, ok := e.n.rules.Load().Rule(rule)
	if !ok {
		return 0, 0, false
	}
	f := r.Lease.Split(subject)
	return r.Burst * f, r.Rate * f, true
}

func (e nodeUpstream) Clamped() { e.n.m.upstreamClamped.Inc() }

func (e nodeUpstream) LearnedSafe(rule string) *float64 {
	return e.n.tuningOf(rule, e.n.cfg.Region).SafeShare
}

func (e nodeUpstream) Renewed(err error) {
	res := "ok"
	if err != nil {
		res = "error"
	}
	e.n.m.upstreamRenewals.WithLabelValues(res).Inc()
	now := e.n.clock()
	e.n.upHealth.record(now, err)
	if err == nil {
		e.n.m.upstreamLastOK.Set(float64(now.UnixMilli()) / 1e3)
	}
}

// funded reads the funded quotas: each one's demand (the sum over its live
// subleases) and whether it fits within sizes (cap, rate) of upstream.
type fundedInfo struct {
	info   lease.QuotaInfo
	demand float64
	live   int // live subleases
}

func (u *Upstream) read() map[string]fundedInfo {
	out := map[string]fundedInfo{}
	u.env.Read(func(s *lease.State) {
		now := s.Now()
		for _, name := range s.Quotas() {
			q, _ := s.Quota(name)
			if !q.Funded {
				continue
			}
			fi := fundedInfo{info: q}
			for _, l := range s.Leases(name) {
				if l.Expiry >= now {
					fi.demand += l.Demand
					fi.live++
				}
			}
			out[name] = fi
		}
	})
	return out
}

// fits reports whether the quota can no longer be spending beyond its own
// part plus (cap, rate): its ceilings are within them.
func fits(q lease.QuotaInfo, capacity, rate float64) bool {
	tol := func(v float64) float64 { return 1e-9 * max(1, v) }
	b, r := q.Burst+capacity, q.Rate+rate
	return q.CeilBurst <= b+tol(b) && q.CeilRate <= r+tol(r)
}

// Round is one turn of the loop: it reads the funded quotas, renews the
// upstream leases that are due (waiting for the global group's answer) and
// funds the quotas from the answer (waiting for the entry to commit).
func (u *Upstream) Round() {
	env := u.env
	now := env.Now()
	state := u.read()
	for id := range u.quotas {
		if _, ok := state[id]; !ok {
			delete(u.quotas, id)
		}
	}
	var grants, renews []*upQuota
	anyDue := false
	nudged := u.takeNudged()
	// In a fixed order: the order of a request's items and their numbers
	// (one run of internal/sim per seed).
	for _, id := range slices.Sorted(maps.Keys(state)) {
		fi := state[id]
		q := u.quotas[id]
		if q == nil {
			rule, subject, _ := strings.Cut(id, "|")
			q = &upQuota{id: id, rule: rule, subject: subject}
			q.h = lease.Holding{Quota: id, Validity: func(term int64) int64 { return lease.AgentValidity(term, upstreamDrift, 0) }}
			u.quotas[id] = q
		}
		if q.failedAt != 0 && now-q.failedAt < upstreamRetryUnknown.Microseconds() {
			continue
		}
		if fi.live == 0 {
			// Nobody in the region spends this quota: let the upstream
			// lease lapse rather than hold a slice other regions could use
			// (the funding drops at its end, and the idle quota is then
			// removed from the state). The next sublease asks again.
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
		if fits(fi.info, q.h.Lease.Cap, q.h.Lease.Rate) {
			if q.h.Lease.Cap < q.confCap || q.h.Lease.Rate < q.confRate {
				// A shrink the subleases now fit: confirm it at once, so
				// the global group can give the freed share to the regions
				// that want it without waiting for the renew point.
				anyDue = true
			}
			q.confCap, q.confRate = q.h.Lease.Cap, q.h.Lease.Rate
		}
		renewAt := env.RenewAt(q.rule)
		validity := lease.AgentValidity(q.h.Lease.Term, upstreamDrift, 0)
		if now >= q.h.ValidUntil-int64(float64(validity)*(1-renewAt)) {
			anyDue = true
		}
		wants := fi.demand > upstreamWant*(fi.info.Rate+q.h.Lease.Rate)
		// Demand that fell well below what was reported is worth telling
		// at once: another region may want what this one no longer does.
		fell := demandFell(fi.demand, q.sentDemand)
		// A nudge or a fallen demand goes at most every upstreamEarly; a
		// want of more backs off on its own (earlyAt), so that asking in
		// vain never delays the others.
		soon := now >= q.sentAt+upstreamEarly.Microseconds()
		switch {
		case nudged[id] && soon, fell && soon:
			anyDue = true
		case nudged[id]:
			u.nudge([]*rationv1.QuotaRef{{Rule: q.rule, Subject: q.subject}}) // keep it for later
		case wants && now >= q.earlyAt:
			anyDue = true
			q.earlyGap = min(max(2*q.earlyGap, upstreamEarly.Microseconds()), validity/2)
			q.earlyAt = now + q.earlyGap
		case !wants:
			q.earlyGap = 0
		}
		renews = append(renews, q)
	}
	// The safe share each rule's funded quotas all run within (plus their
	// upstream leases): confirmed to the global group in every item.
	confSafe := u.confirmableSafe(state)
	for rule, v := range confSafe {
		if sent, ok := u.sentSafe[rule]; !ok || sent != v {
			anyDue = true // a lowered safe share the global group waits for
		}
	}
	if !anyDue || now < u.retry {
		return
	}
	req := &rationv1.RenewRequest{Holder: u.holder, Region: u.region, Seq: u.seq}
	seqs := make([]uint64, 0, len(grants)+len(renews))
	for i, q := range grants {
		seq := u.seq + uint64(i)
		// As an agent's first grant: ask for at least the quota's own rate
		// until the subleases report real demand.
		demand := max(state[q.id].demand, state[q.id].info.Rate)
		q.h.Grant(now, u.holder, seq, demand)
		q.sentDemand, q.sentAt = demand, now
		seqs = append(seqs, seq)
		req.Items = append(req.Items, &rationv1.RenewItem{
			Quota: &rationv1.QuotaRef{Rule: q.rule, Subject: q.subject}, Demand: demand,
			ConfirmedSafeShare: safeOf(confSafe, q.rule),
		})
	}
	renewSeq := u.seq + uint64(len(grants))
	for _, q := range renews {
		it := q.h.Renewal(now, renewSeq, state[q.id].demand, 0)
		q.sentDemand, q.sentAt = it.Demand, now
		seqs = append(seqs, renewSeq)
		req.Items = append(req.Items, &rationv1.RenewItem{
			Quota: &rationv1.QuotaRef{Rule: q.rule, Subject: q.subject}, LeaseId: it.LeaseID,
			// Nothing given back, whatever Holding owes: see the top.
			Unused: 0, Demand: it.Demand, ConfirmedCap: q.confCap, ConfirmedRate: q.confRate,
			ConfirmedSafeShare: safeOf(confSafe, q.rule),
		})
	}
	u.seq = renewSeq + 1
	if len(req.Items) == 0 {
		return
	}
	logger := env.Logger()
	if logger.Enabled(context.Background(), slog.LevelDebug) {
		for _, it := range req.Items {
			logger.Debug("upstream renewal", "quota", QuotaID(it.Quota.GetRule(), it.Quota.GetSubject()), "lease_id", it.LeaseId, "demand", it.Demand)
		}
	}
	resp, err := env.Renew(req)
	if err == nil && len(resp.GetGrants()) != len(req.Items) {
		err = fmt.Errorf("global group answered %d grants for %d items", len(resp.GetGrants()), len(req.Items))
	}
	if err != nil {
		if env.Ended() {
			return
		}
		env.Renewed(err)
		// A stale seq (an earlier leader's numbers ran ahead of this
		// clock, or someone acting as this region sent one ahead) is
		// skipped past every number the global group admits; any other
		// failure backs off, its numbers already used up (a request
		// applied whose reply was lost is never reused).
		if status.Code(err) == codes.FailedPrecondition {
			u.seq = lease.PastStale(u.seq, env.Now())
		}
		u.back = min(max(2*u.back, upstreamTick), time.Second)
		u.retry = env.Now() + u.back.Microseconds()
		logger.Warn("upstream lease renewal failed: funded quotas spend their slices until they expire, then their safe shares", "err", err)
		return
	}
	env.Renewed(nil)
	u.back, u.retry = 0, 0
	u.sentSafe = confSafe
	recv := env.Now()
	all := append(grants, renews...)
	var funds []lease.Command
	learned := map[string]bool{}
	for i, q := range all {
		g := resp.Grants[i]
		if g.SafeShare != nil && g.GetError() == "" && !learned[q.rule] {
			// The global group's word on this region's safe share: kept
			// in this group's replicated state before any quota uses it.
			learned[q.rule] = true
			if cur := env.LearnedSafe(q.rule); cur == nil || *cur != g.GetSafeShare() {
				v := g.GetSafeShare()
				funds = append(funds, lease.Tune{
					Tuning: lease.Tuning{Rule: q.rule, Region: u.region, SafeShare: &v}, Safe: lease.SafeLearn,
				})
				logger.Info("safe share learned from the global group", "rule", q.rule, "safe_share", v)
			}
		}
		switch e := g.GetError(); {
		case e == "":
			l := lease.Lease{ID: g.LeaseId, Quota: q.id, Balance: g.Balance, Cap: g.Cap, Rate: g.Rate, Term: g.DurationUs}
			clampUpstream(env, q, &l, recv)
			oldCap, oldRate := q.h.Lease.Cap, q.h.Lease.Rate
			if !q.h.Adopt(recv, seqs[i], l) {
				continue
			}
			if q.h.Lease.Rate > upstreamHelped*oldRate || q.h.Lease.Cap > upstreamHelped*oldCap {
				// Asking helped: the next want asks again soon, not after
				// the backoff of the asks that brought nothing before.
				q.earlyGap, q.earlyAt = 0, q.sentAt+upstreamEarly.Microseconds()
			}
			q.failedAt = 0
			if q.h.Valid(recv) {
				funds = append(funds, lease.Fund{
					Quota: q.id, Burst: l.Cap, Rate: rateOr0(l.Rate), Deposit: l.Balance, NotAfter: q.h.ValidUntil,
					Seq: seqs[i],
				})
			}
		case strings.HasPrefix(e, ItemErrUnknownQuota), strings.HasPrefix(e, ItemErrTooManySubjects):
			q.h.Drop()
			q.failedAt = recv
			logger.Error("the global group does not lease this quota: only its safe share applies", "quota", q.id, "err", e)
		default:
			q.h.Drop()
		}
	}
	if len(funds) == 0 {
		return
	}
	res, err := env.Propose(funds)
	if err != nil {
		if !env.Ended() {
			logger.Warn("funding from the upstream lease failed to commit", "err", err)
		}
		return
	}
	var funded []string
	for i, r := range res {
		if r.Err != nil {
			logger.Warn("funding refused", "command", fmt.Sprintf("%+v", funds[i]), "err", r.Err)
		} else if f, ok := funds[i].(lease.Fund); ok {
			funded = append(funded, f.Quota)
		}
	}
	// A smaller upstream lease over-commits the quota until its subleases
	// shrink: tell them now (a larger one is taken by whoever is below its
	// share), so the shrink can be confirmed upstream in round trips.
	env.Funded(funded)
}

// confirmableSafe returns, per rule of the funded quotas, the safe share
// this group may confirm: its learned (or file) safe share, when every
// funded quota of the rule has its own part configured within it and its
// ceilings within that plus its upstream lease (no sublease can still be
// spending under a larger own part). Rules not all fitted are left out.
func (u *Upstream) confirmableSafe(state map[string]fundedInfo) map[string]float64 {
	out := map[string]float64{}
	bad := map[string]bool{}
	for id, fi := range state {
		rule, _, _ := strings.Cut(id, "|")
		if bad[rule] {
			continue
		}
		v, own, ok := u.env.SafeShare(rule)
		if !ok {
			bad[rule] = true
			continue
		}
		if idle(fi.info) {
			// No sublease: nothing is spent until a grant, which
			// reconfigures the quota at v first.
			out[rule] = v
			continue
		}
		var lc, lr float64
		if q := u.quotas[id]; q != nil && q.h.Lease.ID != 0 {
			lc, lr = q.h.Lease.Cap, q.h.Lease.Rate
		}
		if fi.info.Burst > own.Burst+safeTol(own.Burst) || fi.info.Rate > own.Rate+safeTol(own.Rate) || !fits(fi.info, lc, lr) {
			bad[rule] = true
			continue
		}
		out[rule] = v
	}
	for rule := range bad {
		delete(out, rule)
	}
	return out
}

func safeOf(m map[string]float64, rule string) *float64 {
	if v, ok := m[rule]; ok {
		return &v
	}
	return nil
}

// rateOr0 keeps a rate the state machine accepts (0 or at least MinRate).
func rateOr0(r float64) float64 {
	if r < lease.MinRate {
		return 0
	}
	return r
}

// clampUpstream holds an upstream grant to the rule as this group's rules
// give it (lease.GrantBound: the lease's cap and rate, and the tokens
// deposited, which the upstream loop never gives back), whatever its
// -upstream answers: a group that is not the fleet's global group granted
// one region a rate 50,000 times the rule's. The clamp is counted and
// logged.
func clampUpstream(env UpstreamEnv, q *upQuota, l *lease.Lease, now int64) {
	burst, rate, ok := env.Shape(q.rule, q.subject)
	if !ok {
		return
	}
	granted := *l
	if !q.bound.Clamp(now, burst, rate, l) {
		return
	}
	env.Clamped()
	env.Logger().Warn("the global group granted more than the rule allows: held to the rule (check -upstream names the fleet's global group, with the same rules)",
		"quota", q.id, "granted_cap", granted.Cap, "granted_rate", granted.Rate, "granted_tokens", granted.Balance, "burst", burst, "rate", rate)
}
