package sim

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/ration-dev/ration/internal/lease"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// applier applies committed entries to the groups' lease states on a
// goroutine of its own, in commit order, while the event loop goes on with
// the events that do not read a state: the agents' rounds, the decisions,
// the network. The state machine was about 40% of the loop's time (a
// reference run's profile), and it is the same work in the same order
// either way: every answer and every state the loop reads is what the
// loop would have computed itself, so a seed's report is unchanged.
//
// The loop reads a group's state only after drain(g) (every commit of g
// submitted so far applied: the applier touches g's state only through
// them), and an entry's results only through wait. A renewal's answer,
// the bulk of the commits, is built lazily (lazyAnswer): when its reply
// reaches the agent, or at the next drain, whichever is first; nothing the
// loop does in between depends on it, since sending the reply draws the
// same randomness whatever it says.
type applier struct {
	jobs      chan *commit
	submitted uint64        // loop only
	completed atomic.Uint64 // the last commit applied, in submission order
	lazies    []*lazyAnswer // built by no one yet: built at the next drain
	stopped   bool
	done      sync.WaitGroup
}

// commit is one committed entry of group g.
type commit struct {
	g    *group
	cmds []lease.Command
	out  []applied
	sec  int // the second it committed in, for the load series
	n    uint64
}

func newApplier() *applier {
	a := &applier{jobs: make(chan *commit, 1<<14)}
	a.done.Add(1)
	go a.run()
	return a
}

func (a *applier) run() {
	defer a.done.Done()
	for c := range a.jobs {
		bytes := 0
		for i, cmd := range c.cmds {
			if data, err := lease.EncodeCommand(cmd); err == nil {
				bytes += len(data)
			}
			c.out[i].Result, c.out[i].Err = c.g.st.Apply(cmd)
		}
		// The loop counts entries; bytes are the applier's alone, read
		// after the last drain.
		c.g.load.bytes[c.sec] += int64(bytes)
		a.completed.Store(c.n)
	}
}

// submit hands c to the applier (loop only).
func (a *applier) submit(c *commit) {
	a.submitted++
	c.n = a.submitted
	c.g.submitted = c.n
	a.jobs <- c
}

// until waits for the applier to have applied commit n. The applier is
// seldom far behind: the loop yields its processor rather than parking,
// to whatever else is runnable (the applier itself with GOMAXPROCS=1, the
// garbage collector's workers). A spin that yielded only every 64 turns
// took the full reference run from 8 min 55 s to 10 min 25 s (one run
// each, a noisy hour apart; the 30 s run did not tell them apart).
func (a *applier) until(n uint64) {
	for a.completed.Load() < n {
		runtime.Gosched()
	}
}

// wait returns c's answers once applied.
func (a *applier) wait(c *commit) []applied {
	a.until(c.n)
	return c.out
}

// drain waits until g's commits submitted so far are applied, so that the
// loop may read g's state, and builds the lazy answers whose entries are
// applied (loop only).
func (a *applier) drain(g *group) {
	a.until(g.submitted)
	a.settle(a.completed.Load())
}

// settle builds the lazy answers of the commits up to n.
func (a *applier) settle(n uint64) {
	kept := a.lazies[:0]
	for _, l := range a.lazies {
		if l.c.n <= n {
			l.get()
		} else {
			kept = append(kept, l)
		}
	}
	clear(a.lazies[len(kept):])
	a.lazies = kept
}

// stop applies everything, builds every answer and ends the applier;
// once stopped, stop does nothing.
func (a *applier) stop() {
	if a.stopped {
		return
	}
	a.stopped = true
	a.until(a.submitted)
	a.settle(a.submitted)
	close(a.jobs)
	a.done.Wait()
}

// lazyAnswer is a renewal's answer, built once from its commit's results
// by build, which may record failures (stamped with the commit's time).
type lazyAnswer struct {
	a     *applier
	c     *commit
	build func([]applied) (*rationv1.RenewResponse, error)
	built bool
	r     *rationv1.RenewResponse
	err   error
}

// get builds the answer the first time (loop only).
func (l *lazyAnswer) get() (*rationv1.RenewResponse, error) {
	if !l.built {
		l.built = true
		l.r, l.err = l.build(l.a.wait(l.c))
		l.build = nil
	}
	return l.r, l.err
}
