package sim

import (
	"context"
	"fmt"
	"iter"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/holder"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// requestTimeout is the holder's and the upstream's bound on one call.
const requestTimeout = 2_000_000

var errTimeout = status.Error(codes.DeadlineExceeded, "no answer in time (simulated)")

type replyFn func(*rationv1.RenewResponse, *rationv1.ReleaseResponse, error)

// answer is a coordinator's reply to a call, built when it is called: a
// renewal's where the agent receives it (see applier), the rest ready.
type answer func() (*rationv1.RenewResponse, *rationv1.ReleaseResponse, error)

func ready(rr *rationv1.RenewResponse, rl *rationv1.ReleaseResponse, err error) answer {
	return func() (*rationv1.RenewResponse, *rationv1.ReleaseResponse, error) { return rr, rl, err }
}

// call sends a Renew (or a Release) from x to g's leader as x knows it now
// and calls back once: with the answer, an error, or a timeout.
func (s *Sim) call(x endpoint, g *group, renew *rationv1.RenewRequest, release *rationv1.ReleaseRequest, cb replyFn) {
	done := false
	finish := func(rr *rationv1.RenewResponse, rl *rationv1.ReleaseResponse, err error) {
		if done {
			return // a duplicate, or after the timeout
		}
		done = true
		cb(rr, rl, err)
	}
	s.after(requestTimeout, func() { finish(nil, nil, errTimeout) })
	target := g.leaderNode()
	if target == nil {
		// No leader known: the client's redirects find none.
		s.send(x, g.nodes[0].ep(), func() {
			s.send(g.nodes[0].ep(), x, func() { finish(nil, nil, errNotLeader) })
		})
		return
	}
	s.send(x, target.ep(), func() {
		if !target.alive {
			return
		}
		back := func(a answer) {
			if !target.alive {
				return
			}
			s.send(target.ep(), x, func() { finish(a()) })
		}
		if g.leaderNode() != target {
			back(ready(nil, nil, errNotLeader))
			return
		}
		if renew != nil {
			g.renew(renew, back)
		} else {
			g.release(release, func(r *rationv1.ReleaseResponse, err error) { back(ready(nil, r, err)) })
		}
	})
}

// agent is one gateway-agent: a real holder.Leases on a drifting clock.
// Its Round runs as a coroutine (iter.Pull) of the event loop, one switch
// at a time: the loop resumes it (next) and it runs until it yields, either
// done or at a Client call, whose answer the loop leaves in reply before
// resuming it again. A coroutine switch hands the thread over directly,
// where a channel hand-off between goroutines parks one and wakes the
// other through the scheduler (futex calls were a tenth of a reference
// run's time).
type agent struct {
	s      *Sim
	idx    int
	region int
	clock  clock
	gen    int
	alive  bool
	l      *holder.Leases
	cancel context.CancelFunc

	next   func() (yieldMsg, bool) // resumes the Round coroutine
	stop   func()
	yield  func(yieldMsg) bool // the coroutine's side (simClient)
	reply  rpcReply            // a call's answer, set before next
	busy   bool                // in a Round
	stepAt int64               // the next Round (true time), 0: none
}

type yieldMsg struct {
	done    bool
	renew   *rationv1.RenewRequest
	release *rationv1.ReleaseRequest
}

type rpcReply struct {
	renew   *rationv1.RenewResponse
	release *rationv1.ReleaseResponse
	err     error
}

func (a *agent) ep() endpoint { return endpoint{region: a.region, agent: a} }

// simClient is the holder's Client: every call is a yield to the loop. A
// stopped coroutine (the agent crashed) answers every call with a timeout.
type simClient struct{ a *agent }

func (c simClient) Renew(_ context.Context, req *rationv1.RenewRequest) (*rationv1.RenewResponse, error) {
	if !c.a.yield(yieldMsg{renew: req}) {
		return nil, errTimeout
	}
	r := c.a.reply
	return r.renew, r.err
}

func (c simClient) Release(_ context.Context, req *rationv1.ReleaseRequest) (*rationv1.ReleaseResponse, error) {
	if !c.a.yield(yieldMsg{release: req}) {
		return nil, errTimeout
	}
	r := c.a.reply
	return r.release, r.err
}

// start (re)starts the agent as a new incarnation.
func (a *agent) start() error {
	s := a.s
	a.gen++
	l, err := holder.New(holder.Options{
		Client:      simClient{a},
		Holder:      fmt.Sprintf("a%d", a.idx),
		Incarnation: fmt.Sprintf("%d", a.gen),
		Region:      s.regionName(a.region),
		Tick:        s.cfg.HolderTick,
		// Decisions cannot wait here (the loop is single-threaded): a
		// quota's decisions before its first grant take the failure
		// policy, and Prepare asks for every quota at start.
		ColdStart: 1,
		// The loop bounds every call itself (requestTimeout in call): a
		// real timer per Round would only cost time.
		RequestTimeout: -1,
		Clock:          func() int64 { return a.clock.at(s.now) },
		SortedScans:    true,
	})
	if err != nil {
		return err
	}
	a.l = l
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	a.next, a.stop = iter.Pull(func(yield func(yieldMsg) bool) {
		a.yield = yield
		for {
			l.Round(ctx)
			if !yield(yieldMsg{done: true}) {
				return
			}
		}
	})
	a.alive, a.busy = true, false
	for _, q := range s.agentQuotas[a.region] {
		l.Prepare(q.rule, q.subject)
	}
	a.schedule(s.now)
	return nil
}

// crash stops the agent at once: its leases stay with the coordinators
// until they expire. A Round parked in a call ends with every further call
// failing, sending nothing more anywhere.
func (a *agent) crash() {
	if !a.alive {
		return
	}
	a.alive = false
	a.stepAt = 0
	a.busy = false
	a.stop()
	a.cancel()
}

// schedule makes sure a Round happens at t or earlier.
func (a *agent) schedule(t int64) {
	if !a.alive || a.busy || (a.stepAt != 0 && a.stepAt <= t) {
		return
	}
	a.stepAt = t
	gen := a.gen
	a.s.at(t, func() {
		if a.stepAt != t || a.gen != gen || !a.alive || a.busy {
			return
		}
		a.stepAt = 0
		a.busy = true
		a.await()
	})
}

// await resumes the Round and takes its next yield: a call to send, or the
// Round's end.
func (a *agent) await() {
	s := a.s
	y, _ := a.next()
	if y.done {
		a.busy = false
		s.stats.rounds++
		due := a.l.Due()
		next := s.now + us(s.cfg.HolderTick)
		if t := a.clock.trueAt(due); t > next {
			next = t
		}
		a.schedule(next)
		return
	}
	gen := a.gen
	s.call(a.ep(), s.groups[1+a.region], y.renew, y.release, func(rr *rationv1.RenewResponse, rl *rationv1.ReleaseResponse, err error) {
		if a.gen != gen || !a.alive {
			return
		}
		a.reply = rpcReply{renew: rr, release: rl, err: err}
		a.await()
	})
}

// poke is called after decisions: a quota that ran dry or appeared wants
// a Round at the holder's next tick.
func (a *agent) poke() {
	if a.alive && !a.busy && a.l.Due() <= a.clock.at(a.s.now) {
		a.schedule(a.s.now + us(a.s.cfg.HolderTick))
	}
}
