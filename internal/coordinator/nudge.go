package coordinator

import (
	"cmp"
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/lease"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Shares move in round trips, not in lease periods. After every Renew the
// leader marks the quotas it touched (rebalance), and its planner looks at
// each marked quota within a few milliseconds (planLoop; once per round, not
// once per renewal, so that a renewal's cost does not grow with the
// quota's holders): when a holder is
// materially below its fair share (a newcomer, or a demand that rose), it
// tells the holders above theirs to renew at once, over each holder's Watch
// stream. Their renewal shrinks them (the shrink stays reserved at the old
// size until they confirm it, which they do at once, giving back what is
// above their new cap); the confirmation frees rate and room, and the
// rebalance after it tells the holders below their share to renew and take
// it. A nudge carries no terms: sizes only ever change through committed
// Renews, so the conservation argument is untouched, and a lost nudge only
// costs speed (the holder renews at its renew point anyway).

// Thresholds of rebalance. A holder is below its share when it holds less
// than underShare of its target; a smaller gap is left to the renew point,
// so that shares do not churn on noise in the demands.
const (
	underShare = 0.9
	// urgentShare: a holder below this much of its target (a newcomer, a
	// demand that jumped tenfold), lacking at least this much of an even
	// share, is nudged for at once, past the cooldown. On the simulator a
	// half let most of the storm through: holders whose estimates restart
	// after a fall (see internal/holder) sit below half their targets
	// often.
	urgentShare = 0.1
	// freeShare: this much of an even share free makes a plan urgent.
	freeShare = 0.5
	// nudgeCooldown: a holder is nudged for a quota at most once per
	// cooldown unless the plan is urgent (see Damper).
	nudgeCooldown = 250 * time.Millisecond
	// nudgeFlush coalesces nudges for one holder: a stream sends at most one
	// message per nudgeFlush.
	nudgeFlush = 10 * time.Millisecond
	// maxNudgeQuotas bounds the quotas of one Nudge message, far below
	// gRPC's default 4 MiB message limit (a quota name is at most 256
	// bytes).
	maxNudgeQuotas = 4096
	// watchIdle is how long a configured agent id's incarnation is
	// remembered after its last request, for duplicate detection.
	watchIdle = time.Minute
)

// watcher is one holder's open Watch stream on this leader.
type watcher struct {
	wake    chan struct{} // cap 1
	gone    chan struct{} // closed when a newer stream of the holder replaces it
	mu      sync.Mutex
	pending map[string]struct{} // quota ids to nudge
}

// watchers are the open Watch streams, by holder. A holder has at most one:
// a new stream (a reconnect) replaces the old one.
type watchers struct {
	mu sync.Mutex
	m  map[string]*watcher
}

func (ws *watchers) add(holder string) *watcher {
	w := &watcher{wake: make(chan struct{}, 1), gone: make(chan struct{}), pending: map[string]struct{}{}}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.m == nil {
		ws.m = map[string]*watcher{}
	}
	if old := ws.m[holder]; old != nil {
		close(old.gone)
	}
	ws.m[holder] = w
	return w
}

func (ws *watchers) remove(holder string, w *watcher) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.m[holder] == w {
		delete(ws.m, holder)
	}
}

// nudge queues quota for holder's stream; false when the holder has none.
func (ws *watchers) nudge(holder, quota string) bool {
	ws.mu.Lock()
	w := ws.m[holder]
	ws.mu.Unlock()
	if w == nil {
		return false
	}
	w.mu.Lock()
	w.pending[quota] = struct{}{}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return true
}

func (w *watcher) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.pending))
	for q := range w.pending {
		out = append(out, q)
	}
	clear(w.pending)
	slices.Sort(out)
	return out
}

// Watch serves a holder's nudge stream while this node leads.
func (s *leasesServer) Watch(req *rationv1.WatchRequest, stream rationv1.Leases_WatchServer) (err error) {
	n := s.n
	ctx := stream.Context()
	defer func() {
		if r := recover(); r != nil {
			n.logger.Error("panic in gRPC handler", "method", "Watch", "panic", r, "stack", string(debug.Stack()))
			err = status.Error(codes.Internal, "internal error in Watch")
		}
	}()
	t := n.term.Load()
	if err := n.servable(); err != nil {
		return n.rpcError(ctx, err)
	}
	if msg := checkHolderName(req.GetHolder()); msg != "" {
		return status.Error(codes.InvalidArgument, "watch: "+msg)
	}
	if err := n.authorizeHolder(ctx, req.GetHolder()); err != nil {
		return n.rpcError(ctx, err)
	}
	n.seenHolder(ctx, req.GetHolder())
	w := n.watch.add(req.Holder)
	defer n.watch.remove(req.Holder, w)
	if err := stream.Send(&rationv1.Nudge{}); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-w.gone:
			return status.Error(codes.Aborted, "watch: replaced by a newer stream of the same holder")
		case <-t.ctx.Done():
			return n.rpcError(ctx, ErrNotLeader)
		case <-n.drain:
			return n.rpcError(ctx, ErrStopped)
		case <-w.wake:
		}
		ids := w.take()
		if len(ids) == 0 {
			continue
		}
		for chunk := range slices.Chunk(ids, maxNudgeQuotas) {
			msg := &rationv1.Nudge{Quotas: make([]*rationv1.QuotaRef, 0, len(chunk))}
			for _, id := range chunk {
				rule, subject, _ := strings.Cut(id, "|")
				msg.Quotas = append(msg.Quotas, &rationv1.QuotaRef{Rule: rule, Subject: subject})
			}
			if err := stream.Send(msg); err != nil {
				return err
			}
		}
		n.m.nudges.Add(float64(len(ids)))
		// Coalesce: what is nudged meanwhile goes in the next message.
		select {
		case <-ctx.Done():
		case <-time.After(nudgeFlush):
		}
	}
}

// rebalance marks quotas for the leader's nudge planner after a request by
// requester was applied (see the top of this file). Requests are marked in
// apply order (the responder marks them, not the handlers, whose
// goroutines may run in any order): the planner leaves out a quota's last
// requester, and under load a handler marking late made an earlier request
// look like the last one, so the holder it should have nudged (sized
// before a later request freed rate) waited for its renew point. It costs
// O(1) per quota, whatever the number of the quota's holders: the plan itself
// (planNudges, which reads every live lease of the quota) runs in the
// term's planner (planLoop), once per quota per planning round, not once
// per renewal.
func (n *Node) rebalance(quotas []string, requester string) {
	if len(quotas) == 0 {
		return
	}
	if t := n.term.Load(); t != nil {
		t.plan.mark(quotas, requester)
	}
}

// Pacing of the nudge planner. A round plans every quota marked since the
// last one, at most one round per planMin; a quota whose last plan read
// n live leases is planned again no sooner than n * planPerLease after it
// (and planMin at least). So the planner reads at most 1/planPerLease
// leases per second per busy quota, whatever its number of holders, and a
// renewal costs the leader O(1) on its way out: marking its quota.
const (
	planMin      = 5 * time.Millisecond
	planPerLease = 20 * time.Microsecond
)

// planner holds the quotas marked since the last planning round of a term.
type planner struct {
	mu sync.Mutex
	// dirty maps each marked quota to the holder of the last request that
	// marked it ("" for a release): that holder is not nudged, since its
	// answer was sized against the state the plan reads (the per-request
	// exclusion of the plan's last request).
	dirty map[string]string
	wake  chan struct{} // cap 1
	// visited counts the leases the plans read (tests, see
	// LeasesVisited).
	visited atomic.Int64
}

func newPlanner() *planner {
	return &planner{dirty: map[string]string{}, wake: make(chan struct{}, 1)}
}

func (p *planner) mark(quotas []string, requester string) {
	p.mu.Lock()
	for _, q := range quotas {
		p.dirty[q] = requester
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// again marks quota for a later round (its plan held a nudge back),
// unless a request marked it meanwhile. It does not wake the planner: the
// round that held it back sets its own timer.
func (p *planner) again(quota string) {
	p.mu.Lock()
	if _, ok := p.dirty[quota]; !ok {
		p.dirty[quota] = ""
	}
	p.mu.Unlock()
}

// take returns the marked quotas that are due at now (not held back by
// next), leaving the others marked, and the earliest time one of those
// is due (zero when none is left).
func (p *planner) take(now time.Time, next map[string]time.Time) (map[string]string, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var soonest time.Time
	var out map[string]string
	for q, req := range p.dirty {
		if at, ok := next[q]; ok && at.After(now) {
			if soonest.IsZero() || at.Before(soonest) {
				soonest = at
			}
			continue
		}
		if out == nil {
			out = make(map[string]string, len(p.dirty))
		}
		out[q] = req
		delete(p.dirty, q)
	}
	return out, soonest
}

// planLoop is the term's nudge planner: it plans the marked quotas in
// rounds (see planMin and planPerLease) and queues the nudges on the
// holders' Watch streams.
func (n *Node) planLoop(t *term) {
	defer n.wg.Done()
	p := t.plan
	next := map[string]time.Time{} // quota -> earliest next plan
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	type nudge struct{ holder, quota string }
	var out []nudge
	var damp Damper // times since base
	base := time.Now()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-p.wake:
		case <-timer.C:
		}
		now := time.Now()
		for q, at := range next {
			if !at.After(now) {
				delete(next, q)
			}
		}
		batch, soonest := p.take(now, next)
		out = out[:0]
		if len(batch) > 0 {
			at := now.Sub(base).Microseconds()
			n.fsm.read(func(s *lease.State) {
				for qid, requester := range batch {
					holders, urgent, read := PlanQuota(s, qid, requester)
					p.visited.Add(int64(read))
					if d := time.Duration(read) * planPerLease; d > planMin {
						next[qid] = now.Add(d)
					}
					planned := len(holders)
					holders, retryAt := damp.Filter(qid, holders, urgent, at)
					if held := planned - len(holders); held > 0 {
						n.m.nudgesHeld.Add(float64(held))
					}
					if retryAt != 0 {
						// Held back: planned again once the cooldown ends,
						// against the state then.
						due := base.Add(time.Duration(retryAt) * time.Microsecond)
						if due.After(next[qid]) {
							next[qid] = due
						}
						p.again(qid)
						if soonest.IsZero() || next[qid].Before(soonest) {
							soonest = next[qid]
						}
					}
					for _, h := range holders {
						out = append(out, nudge{h, qid})
					}
				}
			})
		}
		for _, x := range out {
			n.watch.nudge(x.holder, x.quota)
		}
		// The next round: not before planMin, nor before the first quota
		// held back is due; at once (after planMin) if more were marked.
		wait := planMin
		if !soonest.IsZero() {
			wait = max(wait, time.Until(soonest))
		}
		select {
		case <-t.ctx.Done():
			return
		case <-time.After(planMin):
		}
		if wait > planMin {
			timer.Reset(wait - planMin)
		}
	}
}

// PlanMin and PlanPerLease pace the nudge planner (planMin, planPerLease),
// exported for the simulator (internal/sim), which plans as a leader does.
const (
	PlanMin      = planMin
	PlanPerLease = planPerLease
)

// PlanQuota is one planning round's look at quota qid in state s: the
// holders to nudge (planNudges, less requester, the holder of the request
// that marked it, whose answer was sized against this state), whether the
// plan is urgent (see planNudges), and how many live leases the plan read
// (0 when there was nobody else to move). It is the leader's plan,
// exported for the simulator.
func PlanQuota(s *lease.State, qid, requester string) (nudge []string, urgent bool, read int) {
	switch live := s.LiveLeases(qid); {
	case live == 0, live == 1 && requester != "":
		return nil, false, 0 // nobody else to move; the requester was just sized
	}
	shares, freeCap, freeRate, pool, ok := s.Shares(qid)
	if !ok {
		return nil, false, 0
	}
	holders, urgent := planNudges(shares, freeCap, freeRate, pool)
	for _, h := range holders {
		if h != requester {
			nudge = append(nudge, h)
		}
	}
	return nudge, urgent, len(shares)
}

// planNudges returns the holders of one quota to nudge: when some holder
// is below underShare of its target, or the quota is over-committed (its
// capacity fell below what is reserved: a region's upstream lease shrank),
// the holders above their targets (the largest excess first, until their
// excess covers the deficit; an unconfirmed shrink counts as excess), and,
// when rate or room is free, the holders below (to take it). urgent (the
// Damper lets the plan through at once): the quota is over-committed, or
// a holder is below urgentShare of its target and lacks urgentShare of an
// even share, or freeShare of an even share is free while a holder is
// below its own. Pure, for tests.
func planNudges(shares []lease.Share, freeCap, freeRate, pool float64) (out []string, urgent bool) {
	deficitRate, deficitCap := max(0, -freeRate), max(0, -freeCap)
	urgent = deficitRate > 0 || deficitCap > 0
	// An urgent gap is also large next to an even share: a subject of the
	// Zipf tail whose tiny share moved with its noisy demand is not.
	var meanRate, meanCap float64
	for _, s := range shares {
		meanRate += s.TargetRate
		meanCap += s.TargetCap
	}
	meanRate /= float64(max(1, len(shares)))
	meanCap /= float64(max(1, len(shares)))
	var under []string
	for _, s := range shares {
		if s.Rate < underShare*s.TargetRate || s.Cap < underShare*s.TargetCap {
			under = append(under, s.Holder)
			deficitRate += max(0, s.TargetRate-s.Rate)
			deficitCap += max(0, s.TargetCap-s.Cap)
			urgent = urgent ||
				s.Rate < urgentShare*s.TargetRate && s.TargetRate-s.Rate >= urgentShare*meanRate ||
				s.Cap < urgentShare*s.TargetCap && s.TargetCap-s.Cap >= urgentShare*meanCap
		}
	}
	if len(under) == 0 && deficitRate == 0 && deficitCap == 0 {
		return nil, false
	}
	// Half an even share free (a holder left or shrank a lot): those
	// below their shares take it at once. A storm frees crumbs.
	urgent = urgent || len(under) > 0 && (freeRate >= freeShare*meanRate && meanRate > 0 || freeCap >= freeShare*meanCap && meanCap > 0)
	type excess struct {
		holder    string
		rate, cap float64
	}
	var over []excess
	for _, s := range shares {
		e := excess{s.Holder, s.ResRate - s.TargetRate, s.ResCap - s.TargetCap}
		if e.rate > 0 || e.cap > 0 {
			over = append(over, e)
		}
	}
	slices.SortStableFunc(over, func(a, b excess) int {
		return cmp.Or(cmp.Compare(b.rate, a.rate), cmp.Compare(b.cap, a.cap))
	})
	var gotRate, gotCap float64
	for _, e := range over {
		if gotRate >= deficitRate && gotCap >= deficitCap {
			break
		}
		out = append(out, e.holder)
		gotRate += max(0, e.rate)
		gotCap += max(0, e.cap)
	}
	if freeRate > 0 || freeCap > 0 || pool > 0 {
		out = append(out, under...)
	}
	return out, urgent
}

// Damper damps nudge storms. Under contention every renewal moves the
// shares a little (each holder's demand report is noisy), some holder
// drifts below underShare of its target, the plan nudges the holders
// above theirs, their renewals move the shares again: measured on the
// simulator, about 8 times the renewals of a quota without nudges, for
// half a percent of utilisation. So a holder is nudged for a quota at most
// once per nudgeCooldown, unless the plan is urgent (see planNudges: a
// newcomer, a tenfold jump of demand, a holder that left, the quota
// over-committed), which goes at once as before. A nudge held back is not
// lost: the quota is planned again when the cooldown ends.
//
// Times are microseconds on any clock that only moves forward. The zero
// value is ready; it is not safe for concurrent use (one planner owns it).
type Damper struct {
	last  map[damperKey]int64 // when each holder was last nudged for each quota
	swept int64
}

type damperKey struct{ holder, quota string }

// Filter returns which of holders to nudge for quota now, and when the
// first one held back may be nudged (0: none held back). It records the
// nudges it lets through.
func (d *Damper) Filter(quota string, holders []string, urgent bool, now int64) (out []string, retryAt int64) {
	if len(holders) == 0 {
		return nil, 0
	}
	cool := nudgeCooldown.Microseconds()
	if d.last == nil {
		d.last = map[damperKey]int64{}
	}
	if now-d.swept > 4*cool {
		// Forget what no longer holds anything back: the map stays as
		// large as the nudges of the last few cooldowns.
		d.swept = now
		for k, at := range d.last {
			if now-at >= cool {
				delete(d.last, k)
			}
		}
	}
	for _, h := range holders {
		k := damperKey{h, quota}
		if at, ok := d.last[k]; ok && !urgent && now-at < cool {
			if retryAt == 0 || at+cool < retryAt {
				retryAt = at + cool
			}
			continue
		}
		d.last[k] = now
		out = append(out, h)
	}
	return out, retryAt
}

// checkHolderName is the holder name check of checkHolderRequest, as an
// item of text ("" when fine).
func checkHolderName(h string) string {
	switch {
	case h == "":
		return "holder is empty"
	case len(h) > lease.MaxNameLen:
		return fmt.Sprintf("holder is %d bytes, at most %d", len(h), lease.MaxNameLen)
	}
	return ""
}

// incarnations tracks, per configured agent id, the incarnations (agent
// processes) this leader has heard from recently, to notice two live
// processes configured with one id: they are distinct holders and
// conservation holds, but an operator wants to know (their metrics and
// logs are mixed up). A restart is not a duplicate: the old incarnation
// falls silent before the new one speaks.
type incarnations struct {
	mu   sync.Mutex
	byID map[string]map[string]*seenIncarnation
	// swept is when old entries were last dropped.
	swept time.Time
}

type seenIncarnation struct {
	first, last time.Time
	addr        string
	reported    bool
}

// seenHolder records a request from holder (an agent's "<id>/<incarnation>";
// other names are ignored) and reports a duplicate once per pair.
func (n *Node) seenHolder(ctx context.Context, holder string) {
	id, inc, ok := splitHolder(holder)
	if !ok {
		return
	}
	addr := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	now := n.clock()
	ins := &n.incs
	ins.mu.Lock()
	if ins.byID == nil {
		ins.byID = map[string]map[string]*seenIncarnation{}
	}
	if now.Sub(ins.swept) > watchIdle {
		ins.swept = now
		for id, m := range ins.byID {
			for k, s := range m {
				if now.Sub(s.last) > watchIdle {
					delete(m, k)
				}
			}
			if len(m) == 0 {
				delete(ins.byID, id)
			}
		}
	}
	m := ins.byID[id]
	if m == nil {
		m = map[string]*seenIncarnation{}
		ins.byID[id] = m
	}
	me := m[inc]
	if me == nil {
		me = &seenIncarnation{first: now}
		m[inc] = me
	}
	me.last, me.addr = now, addr
	var other *seenIncarnation
	var otherInc, otherAddr string
	for k, s := range m {
		// Another incarnation that spoke after this one first did: both
		// processes are alive at once.
		if k != inc && s.last.After(me.first) && now.Sub(s.last) <= watchIdle && !(s.reported && me.reported) {
			other, otherInc = s, k
			break
		}
	}
	if other != nil {
		me.reported, other.reported = true, true
		otherAddr = other.addr
	}
	ins.mu.Unlock()
	if other != nil {
		n.m.duplicateHolders.Inc()
		n.logger.Warn("two agent processes use the same agent id: they are kept apart (each its own leases), but give each its own -id",
			"agent_id", id, "incarnation", inc, "addr", addr, "other_incarnation", otherInc, "other_addr", otherAddr)
	}
}

// splitHolder splits an agent holder name "<id>/<incarnation>".
func splitHolder(h string) (id, inc string, ok bool) {
	i := strings.LastIndexByte(h, '/')
	if i <= 0 || i == len(h)-1 || strings.HasPrefix(h, "region/") {
		return "", "", false
	}
	return h[:i], h[i+1:], true
}
