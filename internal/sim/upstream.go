package sim

import (
	"iter"
	"log/slog"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/region"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// upstreamRenewAt is the coordinator's default -upstream-renew-at.
const upstreamRenewAt = 0.5

// upstream runs a regional group's upstream loop: internal/coordinator's
// own (coordinator.Upstream, a new one each term, as a new leader starts
// one), with safe shares 0 and without the global leader's nudges. Its
// Round runs as a coroutine of the event loop (iter.Pull), as an agent's
// does, switching at its two waits: the call to the global group and the
// commit of its Fund entry. A term's end stops it where it waits: the
// call or the entry then fails, as the real loop's context does.
type upstream struct {
	g      *group
	u      *coordinator.Upstream // this term's, nil before its first round
	term   int
	leader *cnode
	next   func() (upYield, bool)
	stop   func()
	yield  func(upYield) bool
	reply  upReply // a wait's answer, set before next
	busy   bool    // in a Round
}

// upYield is what a Round waits for: the global group's answer to renew,
// or cmds committed; or the Round is done.
type upYield struct {
	done  bool
	renew *rationv1.RenewRequest
	cmds  []lease.Command
}

type upReply struct {
	resp    *rationv1.RenewResponse
	results []applied
	err     error
}

var discard = slog.New(slog.DiscardHandler)

func newUpstream(g *group) *upstream { return &upstream{g: g} }

// reset is a new term: the old leader's loop ends (its upstream leases
// lapse; their funding drops at NotAfter or at LeaderElected).
func (u *upstream) reset() {
	if u.stop != nil {
		u.stop()
	}
	*u = upstream{g: u.g}
}

// round is a tick of the loop: a Round, unless one is still waiting.
func (u *upstream) round() {
	g, s := u.g, u.g.s
	if !g.ready || u.busy {
		return
	}
	if u.u == nil || u.term != g.term {
		u.reset()
		u.term, u.leader = g.term, g.leaderNode()
		env := simUpstream{u}
		u.u = coordinator.NewUpstream(env, s.regionName(g.region), coordinator.UpstreamSeqStart(env))
		u.next, u.stop = iter.Pull(func(yield func(upYield) bool) {
			u.yield = yield
			for {
				u.u.Round()
				if !yield(upYield{done: true}) {
					return
				}
			}
		})
	}
	u.busy = true
	u.await()
}

// await resumes the Round and serves its next wait, or ends the round.
func (u *upstream) await() {
	g, s := u.g, u.g.s
	y, ok := u.next()
	if !ok || y.done {
		u.busy = false
		return
	}
	term := u.term
	if y.renew != nil {
		s.call(u.leader.ep(), s.global, y.renew, nil, func(resp *rationv1.RenewResponse, _ *rationv1.ReleaseResponse, err error) {
			if g.term != term {
				return // stopped with its term
			}
			u.reply = upReply{resp: resp, err: err}
			u.await()
		})
		return
	}
	g.propose(y.cmds, func(c *commit) {
		// Called in this term only (see commitThrough).
		res := s.apply.wait(c)
		for i, r := range res {
			if _, fund := y.cmds[i].(lease.Fund); fund && r.Err != nil {
				s.fail("%s: Fund %+v refused: %v", g.name, y.cmds[i], r.Err)
			}
		}
		u.reply = upReply{results: res}
		u.await()
	})
}

// simUpstream is the upstream loop's coordinator.UpstreamEnv in the
// simulator.
type simUpstream struct{ u *upstream }

func (e simUpstream) Now() int64 { return e.u.leader.clock.at(e.u.g.s.now) }

func (e simUpstream) Read(f func(*lease.State)) {
	g := e.u.g
	g.s.apply.drain(g)
	f(g.st)
}

func (e simUpstream) Renew(req *rationv1.RenewRequest) (*rationv1.RenewResponse, error) {
	if !e.u.yield(upYield{renew: req}) {
		return nil, errTimeout
	}
	return e.u.reply.resp, e.u.reply.err
}

func (e simUpstream) Propose(cmds []lease.Command) ([]coordinator.OpResult, error) {
	if !e.u.yield(upYield{cmds: cmds}) {
		return nil, errNotLeader
	}
	return e.u.reply.results, e.u.reply.err
}

func (e simUpstream) Funded(quotas []string) { e.u.g.mark(quotas, "") }
func (e simUpstream) Ended() bool            { return e.u.g.term != e.u.term }
func (e simUpstream) RenewAt(string) float64 { return upstreamRenewAt }

// SafeShare: the simulated rules give no region a safe share.
func (e simUpstream) SafeShare(rule string) (float64, region.Share, bool) {
	_, ok := e.u.g.s.rules[rule]
	return 0, region.Share{}, ok
}

// Shape is the simulated rule's burst and rate.
func (e simUpstream) Shape(rule, subject string) (float64, float64, bool) {
	r, ok := e.u.g.s.rules[rule]
	if !ok {
		return 0, 0, false
	}
	f := r.Lease.Split(subject)
	return r.Burst * f, r.Rate * f, true
}

func (e simUpstream) Clamped()                    {}
func (e simUpstream) LearnedSafe(string) *float64 { return nil }
func (e simUpstream) Renewed(error)               {}
func (e simUpstream) Logger() *slog.Logger        { return discard }
