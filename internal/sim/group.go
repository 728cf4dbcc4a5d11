package sim

import (
	"errors"
	"math"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/region"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// itemErrUnknownQuota is the item error of a quota the simulated rules
// do not lease in a group.
const itemErrUnknownQuota = coordinator.ItemErrUnknownQuota

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

// applied is one command's result.
type applied = coordinator.OpResult

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
		if res[0].Err != nil {
			s.fail("%s: LeaderElected refused: %v", g.name, res[0].Err)
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

// quotaFor resolves an item's quota for holder from the simulated rules
// (the coordinator's QuotaResolver): the quota id, its shape, the holder's
// weight, or an item error.
func (g *group) quotaFor(ref *rationv1.QuotaRef, holder string) (string, lease.ConfigureQuota, float64, *lease.Bounds, string) {
	s := g.s
	id := coordinator.QuotaID(ref.GetRule(), ref.GetSubject())
	spec, ok := s.specs[id]
	if !ok || (!spec.global && spec.region != g.region) {
		return "", lease.ConfigureQuota{}, 0, nil, itemErrUnknownQuota + ": no such leased rule in " + g.name
	}
	cfg := lease.ConfigureQuota{
		Quota: id, Burst: spec.burst, Rate: spec.rate,
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
			return "", lease.ConfigureQuota{}, 0, nil, itemErrUnknownQuota + ": the global group leases global rules to regions only"
		} else {
			weight = 1
		}
	}
	return id, cfg, weight, nil, ""
}

// requestError is a whole request's error as the client sees it (the
// coordinator's rpcStatus): a stale or reused seq is FailedPrecondition;
// anything else is a state machine error no item names, a failure of the
// run.
func (g *group) requestError(at int64, holder string, err error) error {
	if errors.Is(err, lease.ErrStale) {
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	g.s.failAt(at, "%s: request of %s failed: %v", g.name, holder, err)
	return status.Error(codes.Internal, err.Error())
}

// renew answers a RenewRequest with the coordinator's own request
// handling (coordinator.PlanRenew): its commands, all in one entry, and
// its answer from their results. reply gets the answer, built where it is
// called (the applier may still be applying the entry when reply is
// called).
func (g *group) renew(req *rationv1.RenewRequest, reply func(answer)) {
	replyNow := func(r *rationv1.RenewResponse, err error) { reply(ready(r, nil, err)) }
	if !g.ready {
		replyNow(nil, errNotLeader)
		return
	}
	g.load.request(g.s, len(req.Items))
	plan := coordinator.PlanRenew(req, g.quotaFor)
	if len(plan.Ops) == 0 {
		r, _, err := plan.Answer(nil)
		replyNow(r, err)
		return
	}
	g.propose(plan.Commands(), func(c *commit) {
		at := g.s.now
		build := func(results []applied) (*rationv1.RenewResponse, error) {
			r, replayed, err := plan.Answer(results)
			if err != nil {
				return nil, g.requestError(at, req.Holder, err)
			}
			if !replayed {
				g.mark(plan.Touched, req.Holder)
			}
			return r, nil
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

// release answers a ReleaseRequest with the coordinator's own request
// handling (coordinator.PlanRelease).
func (g *group) release(req *rationv1.ReleaseRequest, reply func(*rationv1.ReleaseResponse, error)) {
	if !g.ready {
		reply(nil, errNotLeader)
		return
	}
	g.load.request(g.s, len(req.Items))
	plan := coordinator.PlanRelease(req)
	if len(plan.Ops) == 0 {
		r, _, err := plan.Answer(nil)
		reply(r, err)
		return
	}
	g.s.apply.drain(g)
	released := plan.Touched(g.st)
	at := g.s.now
	g.propose(slices.Clone(plan.Ops), func(c *commit) {
		r, replayed, err := plan.Answer(g.s.apply.wait(c))
		if err != nil {
			reply(nil, g.requestError(at, req.Holder, err))
			return
		}
		if !replayed {
			g.mark(released, "")
		}
		reply(r, nil)
	})
}
