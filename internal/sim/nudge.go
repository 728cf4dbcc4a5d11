package sim

import (
	"slices"
	"strconv"
	"strings"

	"github.com/ration-dev/ration/internal/coordinator"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// planner (Config.Nudges) is a regional group leader's nudge planner, paced as
// internal/coordinator's planLoop: a committed Renew marks its quotas
// (with its holder), a Release or a Fund marks theirs; a round at most
// every PlanMin plans each marked quota with coordinator.PlanQuota (a quota
// read n live leases ago waits n * PlanPerLease first), damps the plan as
// the leader does (coordinator.Damper) and sends each
// nudged agent one message over the network (a Watch stream: lost, cut or
// late like any other). The global group's holders are the regions'
// upstream loops, whose nudges are not modelled: they renew at their renew
// points.
type planner struct {
	dirty   map[string]string // quota -> the holder whose request marked it
	next    map[string]int64  // quota -> no plan before
	roundAt int64             // the next round, 0: none set
	lastAt  int64             // the last round
	term    int
	damp    coordinator.Damper // the leader's damping of nudge storms
}

// mark queues quotas for the leader's next planning round.
func (g *group) mark(quotas []string, requester string) {
	if !g.s.cfg.Nudges || g.region < 0 || len(quotas) == 0 {
		return
	}
	p := &g.plan
	if p.dirty == nil || p.term != g.term {
		// A new term's planner starts empty, as a new leader's does.
		*p = planner{dirty: map[string]string{}, next: map[string]int64{}, term: g.term}
	}
	for _, q := range quotas {
		p.dirty[q] = requester
	}
	g.planRound(max(g.s.now, p.lastAt+us(coordinator.PlanMin)))
}

// planRound makes sure a round happens at t or earlier.
func (g *group) planRound(t int64) {
	p := &g.plan
	if p.roundAt != 0 && p.roundAt <= t {
		return
	}
	p.roundAt = t
	term := g.term
	g.s.at(t, func() {
		if p.roundAt != t || g.term != term {
			return
		}
		p.roundAt = 0
		g.planNow()
	})
}

// planNow is one planning round.
func (g *group) planNow() {
	s, p := g.s, &g.plan
	l := g.leaderNode()
	if !g.ready || l == nil || !l.alive {
		return
	}
	p.lastAt = s.now
	quotas := make([]string, 0, len(p.dirty))
	for q := range p.dirty {
		quotas = append(quotas, q)
	}
	slices.Sort(quotas) // map order is random; a run is not
	s.apply.drain(g)    // the planner reads the state
	nudges := map[int][]*rationv1.QuotaRef{}
	var soonest int64
	for _, q := range quotas {
		if at := p.next[q]; at > s.now {
			if soonest == 0 || at < soonest {
				soonest = at
			}
			continue
		}
		requester := p.dirty[q]
		delete(p.dirty, q)
		holders, urgent, read := coordinator.PlanQuota(g.st, q, requester)
		if d := us(coordinator.PlanPerLease) * int64(read); d > us(coordinator.PlanMin) {
			p.next[q] = s.now + d
		}
		holders, retryAt := p.damp.Filter(q, holders, urgent, s.now)
		if retryAt != 0 {
			// Held back: planned again when the cooldown ends.
			p.dirty[q] = ""
			p.next[q] = max(p.next[q], retryAt)
			if soonest == 0 || p.next[q] < soonest {
				soonest = p.next[q]
			}
		}
		rule, subject, _ := strings.Cut(q, "|")
		for _, h := range holders {
			// A holder is "<agent>/<incarnation>": a stream reaches the
			// process that opened it, not a restarted one.
			if i, gen, ok := agentIndex(h); ok && i < len(s.agents) && s.agents[i].gen == gen {
				nudges[i] = append(nudges[i], &rationv1.QuotaRef{Rule: rule, Subject: subject})
			}
		}
	}
	agents := make([]int, 0, len(nudges))
	for i := range nudges {
		agents = append(agents, i)
	}
	slices.Sort(agents)
	for _, i := range agents {
		a, refs := s.agents[i], nudges[i]
		gen := a.gen
		s.stats.nudges++
		s.send(l.ep(), a.ep(), func() {
			if !a.alive || a.gen != gen {
				return // a Watch stream ends with its process
			}
			a.l.Nudge(refs)
			a.schedule(s.now)
		})
	}
	if soonest != 0 {
		g.planRound(max(soonest, s.now+us(coordinator.PlanMin)))
	}
}

// agentIndex reads an agent's holder id, "a<index>/<incarnation>".
func agentIndex(holder string) (idx, gen int, ok bool) {
	name, inc, ok := strings.Cut(holder, "/")
	rest, isAgent := strings.CutPrefix(name, "a")
	if !ok || !isAgent {
		return 0, 0, false
	}
	idx, err1 := strconv.Atoi(rest)
	gen, err2 := strconv.Atoi(inc)
	return idx, gen, err1 == nil && err2 == nil
}
