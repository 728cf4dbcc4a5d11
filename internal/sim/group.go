package sim

import (
	"errors"
	"math"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/region"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Item errors the simulated coordinator answers itself (the rest come from
// coordinator.ItemError).
const (
	itemErrUnknownQuota = coordinator.ItemErrUnknownQuota
	itemErrRetryGrant   = coordinator.ItemErrRetryGrant
)

var errNotLeader = status.Error(codes.Unavailable, "not the leader (simulated)")

// cnode is one coordinator node of a group.
type cnode struct {
	g      *group
	idx    int
	region int
	clock  clock
	alive  bool
}

func (n *cnode) ep() endpoint { return endpoint{region: n.region, node: n} }

// group is one coordinator group: three nodes, one committed lease state.
type group struct {
	s      *Sim
	idx    int // 0: global; 1+r: region r
	region int // -1: the global group
	name   string
	nodes  []*cnode
	// leader is the index of the node that leads, -1 while there is none;
	// ready once its LeaderElected entry has committed.
	leader int
	ready  bool
	term   int
	st     *lease.State
	// lastStamp keeps the leader's stamps monotonic within a term;
	// lastCommit keeps commits in log order.
	lastStamp, lastCommit int64
	// isolatedSince is when the leader last lost its majority (-1: it has
	// one).
	isolatedSince int64
	// log is this term's entries not yet committed, in order; lost is the
	// last lost term's, until the next election, and lostAt when it was
	// lost.
	log, lost []*entry
	lostAt    int64
	// midEntry, when set, runs once, when the next entry proposed reaches
	// its first follower: a crash fault's moment.
	midEntry  func()
	up        *upstream // regional groups only
	submitted uint64    // the applier's number of this group's last commit
	load      *loadSeries
	plan      planner // regional groups only
}

func (g *group) leaderNode() *cnode {
	if g.leader < 0 {
		return nil
	}
	return g.nodes[g.leader]
}

// reach counts the live nodes n can exchange messages with, itself
// included.
func (g *group) reach(n *cnode) int {
	c := 1
	for _, m := range g.nodes {
		if m != n && m.alive && !g.s.blocked(n.ep(), m.ep()) {
			c++
		}
	}
	return c
}

func (g *group) majority() int { return len(g.nodes)/2 + 1 }

// stamp is the leader's timestamp for a new entry.
func (g *group) stamp() int64 {
	t := max(g.nodes[g.leader].clock.at(g.s.now), g.lastStamp)
	g.lastStamp = t
	return t
}

type applied struct {
	res lease.Result
	err error
}

// never is the receive time of an entry a node does not have.
const never = math.MaxInt64

// entry is one proposed log entry not yet committed.
type entry struct {
	cmds []lease.Command
	// done gets the commit; nil for a lost term's entry, which the next
	// leader commits without an answer to anyone.
	done func(*commit)
	// recv is, per node, when the entry is in its log (true time): the
	// leader's at once, a follower's when the AppendEntries reaches it,
	// never for a node down or cut off. Kept non-decreasing along the
	// log: a follower that gets an entry gets every earlier one with it.
	recv []int64
}

// propose appends cmds as one entry; done gets the commit when it
// commits, whose wait gives the results (see applier). An entry commits
// when the leader reaches a majority: one round trip to its nearest live
// follower, after every earlier entry. An entry the leader could send to
// no follower stays in its log, committed with a later one. An entry still
// uncommitted when the leader loses its term is never answered (its
// proposer times out, as a real proposal does), but it is not gone: the
// next leader commits it if its log has it (see elect).
func (g *group) propose(cmds []lease.Command, done func(*commit)) {
	s := g.s
	l := g.leaderNode()
	if l == nil || !l.alive {
		return
	}
	now := g.stamp()
	for i, c := range cmds {
		cmds[i] = coordinator.StampCommand(c, now)
	}
	e := &entry{cmds: cmds, done: done, recv: make([]int64, len(g.nodes))}
	best := int64(-1)
	for i, f := range g.nodes {
		e.recv[i] = never
		if f == l {
			e.recv[i] = s.now
			continue
		}
		if !f.alive || s.blocked(l.ep(), f.ep()) {
			continue
		}
		out := s.latency(l.ep(), f.ep())
		back := s.latency(f.ep(), l.ep())
		e.recv[i] = s.now + out
		if rt := out + back; best < 0 || rt < best {
			best = rt
		}
	}
	for _, p := range g.log {
		for i, t := range e.recv {
			p.recv[i] = min(p.recv[i], t)
		}
	}
	g.log = append(g.log, e)
	if best < 0 {
		return
	}
	if fn := g.midEntry; fn != nil {
		// The first follower has it before any ack is back: the
		// nearest round trip is longer than its first leg.
		g.midEntry = nil
		first := int64(never)
		for i, t := range e.recv {
			if g.nodes[i] != l {
				first = min(first, t)
			}
		}
		s.at(first, fn)
	}
	// Plus an fsync.
	at := max(s.now+best+200, g.lastCommit)
	g.lastCommit = at
	term := g.term
	s.at(at, func() {
		if g.term != term || g.leader < 0 {
			return // still in g.log when the term ended: see loseLeader
		}
		g.commitThrough(e)
	})
}

// commitThrough commits the log up to e, in order.
func (g *group) commitThrough(e *entry) {
	s := g.s
	for len(g.log) > 0 {
		p := g.log[0]
		g.log[0] = nil
		g.log = g.log[1:]
		c := &commit{g: g, cmds: p.cmds, out: make([]applied, len(p.cmds)), sec: g.load.sec(s)}
		g.load.entries[c.sec]++
		s.apply.submit(c)
		if p.done != nil {
			p.done(c)
		}
		if p == e {
			return
		}
	}
}

// loseLeader ends the term; an election follows. The term's uncommitted
// entries stay where they reached: each node's log holds those that had
// arrived by now (a message still in flight is taken as lost).
func (g *group) loseLeader(why string) {
	if g.leader < 0 {
		return
	}
	s := g.s
	s.logf("%s: leader %d lost (%s)", g.name, g.leader, why)
	g.lost, g.lostAt, g.log = g.log, s.now, nil
	g.leader, g.ready, g.isolatedSince = -1, false, -1
	g.term++
	if g.up != nil {
		g.up.reset()
	}
	s.after(us(s.cfg.ElectionTimeout)+s.exp(s.cfg.ElectionTimeout/2), g.elect)
}

// held is how many of the lost term's entries node i's log has.
func (g *group) held(i int) int {
	n := 0
	for _, e := range g.lost {
		if e.recv[i] > g.lostAt {
			break
		}
		n++
	}
	return n
}

// elect picks a new leader among the live nodes that reach a majority and
// commits its LeaderElected; it tries again later when none can. As
// Raft's election restriction has it, the leader is one whose log is the
// most complete: it commits the lost term's entries it has, in order,
// before its own (no proposer hears of them: each has timed out or will),
// and the entries it lacks are gone.
func (g *group) elect() {
	s := g.s
	if g.leader >= 0 {
		return
	}
	var cands []int
	most := -1
	for i, n := range g.nodes {
		if n.alive && g.reach(n) >= g.majority() {
			h := g.held(i)
			if h > most {
				cands, most = cands[:0], h
			}
			if h == most {
				cands = append(cands, i)
			}
		}
	}
	if len(cands) == 0 {
		s.after(us(s.cfg.ElectionTimeout), g.elect)
		return
	}
	g.leader = cands[s.rng.IntN(len(cands))]
	g.term++
	g.isolatedSince = -1
	s.stats.lostCommitted += int64(most)
	s.stats.lostDropped += int64(len(g.lost) - most)
	if most > 0 {
		s.logf("%s: node %d commits %d of the lost term's %d uncommitted entries", g.name, g.leader, most, len(g.lost))
	}
	for _, e := range g.lost[:most] {
		e.done = nil
		for i, t := range e.recv {
			if t > g.lostAt {
				e.recv[i] = never
			}
		}
		g.log = append(g.log, e)
	}
	g.lost = nil
	// A new term's clock starts at no less than the state's.
	s.apply.drain(g)
	g.lastStamp = max(g.lastStamp, g.st.Now())
	s.stats.elections++
	term := g.term
	g.propose([]lease.Command{lease.LeaderElected{}}, func(c *commit) {
		res := g.s.apply.wait(c)
		if res[0].err != nil {
			s.fail("%s: LeaderElected refused: %v", g.name, res[0].err)
			return
		}
		if g.term == term {
			g.ready = true
			s.logf("%s: node %d leads (term %d)", g.name, g.leader, g.term)
		}
	})
}

// watch is the followers' failure detector: a leader that is down or
// cannot reach a majority for an election timeout loses its term.
func (g *group) watch() {
	l := g.leaderNode()
	if l == nil {
		return
	}
	if !l.alive {
		g.loseLeader("crashed")
		return
	}
	if g.reach(l) >= g.majority() {
		g.isolatedSince = -1
		return
	}
	if g.isolatedSince < 0 {
		g.isolatedSince = g.s.now
	} else if g.s.now-g.isolatedSince >= us(g.s.cfg.ElectionTimeout) {
		g.loseLeader("cut off from its followers")
	}
}

func (g *group) tick() {
	if g.ready {
		g.propose([]lease.Command{lease.Tick{}}, func(*commit) {})
	}
}

// quotaFor resolves an item's quota for holder, as the coordinator does
// from its rules: the quota id, its shape, the holder's weight, or an
// item error.
func (g *group) quotaFor(ref *rationv1.QuotaRef, holder string) (string, lease.QuotaConfig, float64, string) {
	s := g.s
	id := ref.GetRule() + "|" + ref.GetSubject()
	spec, ok := s.specs[id]
	if !ok || (!spec.global && spec.region != g.region) {
		return "", lease.QuotaConfig{}, 0, itemErrUnknownQuota + ": no such leased rule in " + g.name
	}
	cfg := lease.QuotaConfig{
		Burst: spec.burst, Rate: spec.rate,
		LeasePeriod: us(s.cfg.LeasePeriod), SafetyMargin: us(s.cfg.SafetyMargin),
	}
	var weight float64
	if spec.global {
		if g.region >= 0 {
			// A regional group's quota of a global rule is funded: its own
			// part is the region's safe share (0 here), the rest comes from
			// the upstream lease.
			cfg.Burst, cfg.Rate, cfg.Funded = 0, 0, true
		} else if _, isRegion := region.FromHolder(holder); !isRegion {
			return "", lease.QuotaConfig{}, 0, itemErrUnknownQuota + ": the global group leases global rules to regions only"
		} else {
			weight = 1
		}
	}
	return id, cfg, weight, ""
}

// renew answers a RenewRequest as internal/coordinator's leasesServer
// does: a Grant per item with lease_id 0 numbered seq, seq+1, ..., then
// one Renew for the rest numbered after them, all in one entry. reply gets
// the answer, built where it is called (the applier may still be applying
// the entry when reply is called).
func (g *group) renew(req *rationv1.RenewRequest, reply func(answer)) {
	replyNow := func(r *rationv1.RenewResponse, err error) { reply(ready(r, nil, err)) }
	if !g.ready {
		replyNow(nil, errNotLeader)
		return
	}
	g.load.request(g.s, len(req.Items))
	grants := make([]*rationv1.Grant, len(req.Items))
	var cmds []lease.Command
	var renew lease.Renew
	var renewItems, grantItems []int
	var touched []string // quota ids proposed, for the planner
	seq := req.Seq
	for i, it := range req.Items {
		grants[i] = &rationv1.Grant{Quota: it.GetQuota(), LeaseId: it.GetLeaseId()}
		grantSeq := seq
		if it.GetLeaseId() == 0 {
			seq++
		}
		qid, cfg, weight, msg := g.quotaFor(it.GetQuota(), req.Holder)
		if msg != "" {
			grants[i].Error = msg
			continue
		}
		touched = append(touched, qid)
		if it.LeaseId == 0 {
			c := cfg
			cmds = append(cmds, lease.Grant{Holder: req.Holder, Seq: grantSeq, Quota: qid, Demand: it.Demand, Weight: weight, Config: &c})
			grantItems = append(grantItems, i)
			continue
		}
		renew.Items = append(renew.Items, lease.RenewItem{
			LeaseID: it.LeaseId, Quota: qid, Unused: it.Unused, Demand: it.Demand, Weight: weight,
			ConfirmedCap: it.ConfirmedCap, ConfirmedRate: it.ConfirmedRate,
		})
		renewItems = append(renewItems, i)
	}
	if len(renew.Items) > 0 {
		renew.Holder, renew.Seq = req.Holder, seq
		cmds = append(cmds, renew)
	}
	if len(cmds) == 0 {
		replyNow(&rationv1.RenewResponse{Grants: grants}, nil)
		return
	}
	g.propose(cmds, func(c *commit) {
		at := g.s.now
		build := func(results []applied) (*rationv1.RenewResponse, error) {
			return g.answerRenew(at, req, cmds, grants, renew, grantItems, renewItems, touched, results)
		}
		if g.s.cfg.Nudges {
			// The answer marks quotas for the leader's planner now.
			replyNow(build(g.s.apply.wait(c)))
			return
		}
		l := &lazyAnswer{a: g.s.apply, c: c, build: build}
		g.s.apply.lazies = append(g.s.apply.lazies, l)
		reply(func() (*rationv1.RenewResponse, *rationv1.ReleaseResponse, error) {
			r, err := l.get()
			return r, nil, err
		})
	})
}

// answerRenew builds the answer to req from its entry's results, as the
// leasesServer does; at is when the entry committed.
func (g *group) answerRenew(at int64, req *rationv1.RenewRequest, cmds []lease.Command, grants []*rationv1.Grant, renew lease.Renew, grantItems, renewItems []int, touched []string, results []applied) (*rationv1.RenewResponse, error) {
	last := results[len(results)-1]
	replayed := last.res.Replayed
	if errors.Is(last.err, lease.ErrStale) {
		return nil, status.Error(codes.FailedPrecondition, last.err.Error())
	}
	for j, i := range grantItems {
		r := results[j]
		switch {
		case r.err == nil:
			if r.res.Lease == nil || r.res.Lease.Quota != cmds[j].(lease.Grant).Quota {
				return nil, status.Error(codes.FailedPrecondition, "seq reused")
			}
			coordinator.FillGrant(grants[i], r.res.Lease)
		case errors.Is(r.err, lease.ErrStale) && replayed:
			grants[i].Error = itemErrRetryGrant
		default:
			msg := coordinator.ItemError(r.err)
			if msg == "" {
				g.s.failAt(at, "%s: grant for %s failed: %v", g.name, req.Holder, r.err)
				return nil, status.Error(codes.Internal, r.err.Error())
			}
			grants[i].Error = msg
		}
	}
	if len(renewItems) > 0 {
		r := results[len(results)-1]
		if r.err != nil {
			g.s.failAt(at, "%s: renew for %s failed: %v", g.name, req.Holder, r.err)
			return nil, status.Error(codes.Internal, r.err.Error())
		}
		if len(r.res.Items) != len(renew.Items) {
			return nil, status.Error(codes.FailedPrecondition, "seq reused")
		}
		for j, i := range renewItems {
			ir := r.res.Items[j]
			if ir.Err != nil {
				grants[i].Error = coordinator.ItemError(ir.Err)
				continue
			}
			coordinator.FillGrant(grants[i], ir.Lease)
		}
	}
	if !replayed {
		g.mark(touched, req.Holder)
	}
	return &rationv1.RenewResponse{Grants: grants}, nil
}

func (g *group) release(req *rationv1.ReleaseRequest, reply func(*rationv1.ReleaseResponse, error)) {
	if !g.ready {
		reply(nil, errNotLeader)
		return
	}
	g.load.request(g.s, len(req.Items))
	cmds := make([]lease.Command, 0, len(req.Items))
	for i, it := range req.Items {
		cmds = append(cmds, lease.Release{Holder: req.Holder, Seq: req.Seq + uint64(i), LeaseID: it.LeaseId, Unused: it.Unused})
	}
	if len(cmds) == 0 {
		reply(&rationv1.ReleaseResponse{}, nil)
		return
	}
	var released []string
	g.s.apply.drain(g)
	for _, it := range req.Items {
		if l, ok := g.st.LeaseByID(it.LeaseId); ok && l.Holder == req.Holder {
			released = append(released, l.Quota)
		}
	}
	g.propose(cmds, func(c *commit) {
		results := g.s.apply.wait(c)
		last := results[len(results)-1]
		if errors.Is(last.err, lease.ErrStale) {
			reply(nil, status.Error(codes.FailedPrecondition, last.err.Error()))
			return
		}
		if !last.res.Replayed {
			g.mark(released, "")
		}
		reply(&rationv1.ReleaseResponse{Errors: make([]string, len(req.Items))}, nil)
	})
}
