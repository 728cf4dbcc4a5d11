package coordinator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ration-dev/ration/internal/lease"
)

// term is one stretch of leadership of this node. Everything the leader
// runs (the batcher, the responder, the ticker) belongs to a term and ends
// with it; a new term starts from scratch, with a new LeaderElected entry.
type term struct {
	ctx    context.Context
	cancel context.CancelFunc
	// ready is set once LeaderElected (and every entry before it) has been
	// applied: only then does the node serve.
	ready    atomic.Bool
	queue    chan *proposal
	inflight chan *inflight

	// base and start are the term's clock: see startClock.
	base  int64
	start time.Time

	mu sync.Mutex
	// configured holds the quota shapes this term has proposed, so that
	// concurrent renewals of a new quota configure it once, not once per
	// entry in flight.
	configured map[string]lease.QuotaConfig

	// plan holds the quotas to plan nudges for (nudge.go).
	plan *planner
}

// maxInflight bounds the entries proposed but not yet applied. When they
// are all in flight, renewals queue and the next entry carries more of them.
const maxInflight = 16

// proposal is one request's commands, waiting to be stamped, batched and
// committed. Results come back aligned with ops.
type proposal struct {
	ops []pendingOp
	// configs are ConfigureQuota commands (from the coordinator's rules)
	// the ops need; the batcher adds those whose quota exists with another
	// shape, before the ops, in the same entry, and gives each Grant its
	// quota's shape (Grant.Config), which creates the quota if it does not
	// exist: the state machine removes idle quotas, so a grant must not
	// depend on an earlier ConfigureQuota (or on t.configured) still being
	// true when it applies.
	configs []lease.ConfigureQuota
	done    chan proposalResult // buffered: the responder never blocks
	kind    proposalKind
	// touched are the quotas to mark for the nudge planner once the
	// proposal applies (unless it was a replay or stale), and requester
	// the holder whose request it is ("" for none). The responder marks
	// them in apply order: the planner leaves out the last requester of a
	// quota because that request's answer was sized against the latest
	// state, which holds only if no later request's mark came first (see
	// rebalance).
	touched   []string
	requester string
}

type proposalKind uint8

const (
	kindOther proposalKind = iota
	kindRenew
	kindRelease
)

type pendingOp struct {
	cmd    lease.Command // nil for a member change
	member *member
	// admin makes the op the member's admin entry (its admin address)
	// rather than its member entry; adminOps pairs them.
	admin bool
	// allow is a registration change (membership.go).
	allow *allowChange
}

// allowChange registers id to add itself, withdraws it, or seeds it.
type allowChange struct {
	id   string
	mode allowMode
}

// memberChange is the proposal of m's record: its member entry, and its
// admin entry when it has an admin address (memberOps), one op each.
func memberChange(m member) []pendingOp {
	ops := []pendingOp{{member: &m}}
	if m.GRPCAddr != "" && m.AdminAddr != "" {
		ops = append(ops, pendingOp{member: &m, admin: true})
	}
	return ops
}

type proposalResult struct {
	results []OpResult
	err     error
}

// inflight is an entry handed to Raft, and whom to answer when it applies.
type inflight struct {
	future     raft.ApplyFuture
	props      []*proposal
	offsets    []int // where each proposal's ops start in the entry
	configured []string
	commands   int
	start      time.Time
}

// watchLeadership starts a term when Raft makes this node leader and ends
// it when leadership is lost. It never waits for the old term's goroutines:
// they may be waiting on Raft, and Raft may be waiting to tell us of the
// next change. They end on their own, answering their callers.
func (n *Node) watchLeadership() {
	defer n.wg.Done()
	var cur *term
	end := func() {
		if cur != nil {
			cur.cancel()
			n.term.CompareAndSwap(cur, nil)
			cur = nil
			n.m.isLeader.Set(0)
			n.m.ready.Set(0)
		}
	}
	for {
		select {
		case <-n.done:
			end()
			return
		case leader := <-n.notify:
			end()
			if !leader {
				n.logger.Info("leadership lost")
				continue
			}
			ctx, cancel := context.WithCancel(context.Background())
			cur = &term{
				ctx: ctx, cancel: cancel,
				queue:      make(chan *proposal, 4*n.cfg.BatchMax),
				inflight:   make(chan *inflight, maxInflight),
				configured: map[string]lease.QuotaConfig{},
				plan:       newPlanner(),
			}
			n.term.Store(cur)
			n.m.isLeader.Set(1)
			n.wg.Add(1)
			go n.lead(cur)
		}
	}
}

// lead commits LeaderElected before anything is served: a Barrier first
// (everything committed by earlier leaders is applied), then one entry
// with this node's member record and LeaderElected stamped with this
// node's clock, which pushes every live lease's reclaim time to at least
// now + term + margin on this clock. Only once that entry is applied does
// the term become ready and the batcher and ticker start.
func (n *Node) lead(t *term) {
	defer n.wg.Done()
	n.logger.Info("leadership gained; committing LeaderElected before serving")
	backoff := 10 * time.Millisecond
	for {
		err := n.raft.Barrier(n.cfg.ApplyTimeout).Error()
		if err == nil {
			err = n.commitElected(t)
		}
		if err == nil {
			break
		}
		if t.ctx.Err() != nil || errors.Is(err, raft.ErrRaftShutdown) || errors.Is(err, ErrStopped) {
			n.logger.Info("leadership ended before LeaderElected committed", "err", err)
			return
		}
		n.logger.Warn("committing LeaderElected failed; retrying", "err", err)
		select {
		case <-t.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
	t.ready.Store(true)
	n.m.ready.Set(1)
	n.logger.Info("leader ready: LeaderElected applied")
	n.wg.Add(4)
	go n.batch(t)
	go n.respond(t)
	go n.tick(t)
	go n.planLoop(t)
	if n.upClient != nil {
		n.wg.Add(1)
		go n.runUpstream(t)
	}
}

func (n *Node) commitElected(t *term) error {
	var stateNow int64
	n.fsm.read(func(s *lease.State) { stateNow = s.Now() })
	t.startClock(n.clock(), stateNow, n.lastNow.Load())
	now := n.stamp(t)
	cmd, err := lease.EncodeCommand(lease.LeaderElected{Now: now})
	if err != nil {
		return err
	}
	data := encodeEntry(append(memberOps(member{ID: n.cfg.ID, GRPCAddr: n.grpcAddr, AdminAddr: n.adminAddr}), commandOp(cmd)))
	if t.ctx.Err() != nil {
		return ErrNotLeader
	}
	f := n.raft.Apply(data, n.cfg.ApplyTimeout)
	if err := f.Error(); err != nil {
		return err
	}
	if err, ok := f.Response().(error); ok {
		return err
	}
	return nil
}

// startClock fixes the term's time base. The wall clock is read once, at
// the start of the term, and never below the state's clock or this node's
// earlier stamps; from then on the term's timestamps advance with the
// monotonic clock. So an NTP step on the leader cannot move expiries:
// within a term, lease time runs at the leader's clock rate (drift rho at
// most), and across terms LeaderElected re-bases every reclaim time on the
// new leader's clock.
func (t *term) startClock(now time.Time, stateNow, lastNow int64) {
	t.base = max(now.UnixMicro(), stateNow, lastNow)
	t.start = now
}

// stamp returns the term's clock in microseconds: its base plus the
// monotonic time since the term started, never below a time this node
// stamped before (the state machine also applies max(now, last)).
func (n *Node) stamp(t *term) int64 {
	return n.advanceClock(t.base + n.clock().Sub(t.start).Microseconds())
}

func (n *Node) advanceClock(now int64) int64 {
	for {
		last := n.lastNow.Load()
		if now <= last {
			return last
		}
		if n.lastNow.CompareAndSwap(last, now) {
			return now
		}
	}
}

// propose hands p to the current term's batcher and waits for its entry
// to be applied. An error means the outcome is unknown unless it wraps
// ErrNotLeader/ErrNotReady returned before enqueueing; callers retry with
// the same sequence numbers, which the state machine answers once.
func (n *Node) propose(ctx context.Context, p *proposal) ([]OpResult, error) {
	return n.proposeIn(ctx, n.term.Load(), p)
}

// proposeIn proposes within term t only.
func (n *Node) proposeIn(ctx context.Context, t *term, p *proposal) ([]OpResult, error) {
	switch {
	case t == nil:
		return nil, ErrNotLeader
	case !t.ready.Load():
		return nil, ErrNotReady
	}
	p.done = make(chan proposalResult, 1)
	select {
	case t.queue <- p:
	case <-t.ctx.Done():
		return nil, ErrNotLeader
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case r := <-p.done:
		return r.results, r.err
	case <-t.ctx.Done():
		return nil, fmt.Errorf("%w: leadership lost while committing", ErrNotLeader)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// batch is the term's proposer: it takes queued proposals, stamps them
// with one timestamp, and commits as many as fit (BatchMax commands) in one
// Raft entry. With nothing in flight it proposes at once (no added
// latency); with entries in flight it waits up to BatchWait for more, since
// the entry would queue behind them anyway.
func (n *Node) batch(t *term) {
	defer n.wg.Done()
	defer close(t.inflight)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var carry []*proposal // proposals that did not fit the last entry
	for {
		props := carry
		carry = nil
		if len(props) == 0 {
			select {
			case p := <-t.queue:
				props = append(props, p)
			case <-t.ctx.Done():
				n.failQueued(t)
				return
			}
		}
		size := 0
		for _, p := range props {
			size += len(p.ops) + len(p.configs)
		}
	drain:
		for size < n.cfg.BatchMax {
			select {
			case p := <-t.queue:
				props = append(props, p)
				size += len(p.ops) + len(p.configs)
				continue
			default:
			}
			if len(t.inflight) == 0 || n.cfg.BatchWait == 0 {
				break
			}
			timer.Reset(n.cfg.BatchWait)
			select {
			case p := <-t.queue:
				timer.Stop()
				props = append(props, p)
				size += len(p.ops) + len(p.configs)
			case <-timer.C:
				break drain
			case <-t.ctx.Done():
				timer.Stop()
				break drain
			}
		}
		fl, rest := n.build(t, props)
		carry = rest
		if fl == nil {
			continue
		}
		if t.ctx.Err() != nil {
			// Leadership ended while batching: do not propose under a term
			// that is over (the next term starts with its own LeaderElected).
			t.forget(fl.configured)
			for _, p := range append(fl.props, carry...) {
				p.done <- proposalResult{err: ErrNotLeader}
			}
			carry = nil
			continue
		}
		fl.future = n.raft.Apply(fl.data(), n.cfg.ApplyTimeout)
		t.inflight <- &fl.inflight
	}
}

// maxEntryBytes is a soft bound on one entry: a bigger entry delays every
// request batched with it (and the heartbeats behind it). One request is
// never split, so an entry of one large request may exceed it.
const maxEntryBytes = 1 << 20

// build stamps the proposals and lays out one entry, up to maxEntryBytes;
// the proposals that do not fit are returned for the next entry. A proposal
// whose commands cannot be encoded is answered at once and left out.
func (n *Node) build(t *term, props []*proposal) (*entryBuild, []*proposal) {
	now := n.stamp(t)
	b := &entryBuild{inflight: inflight{start: time.Now()}}
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, p := range props {
		enc, err := encodeProposal(p, now)
		if err != nil {
			p.done <- proposalResult{err: fmt.Errorf("%w: %w", ErrInvalidRequest, err)}
			continue
		}
		var configs []op
		var added []lease.ConfigureQuota
		for _, c := range p.configs {
			want := c.Config()
			dup := slices.ContainsFunc(added, func(a lease.ConfigureQuota) bool { return a.Quota == c.Quota })
			if have, ok := t.configured[c.Quota]; ok && have == want || dup {
				continue
			}
			var cur lease.QuotaConfig
			var exists bool
			n.fsm.read(func(s *lease.State) {
				var q lease.QuotaInfo
				q, exists = s.Quota(c.Quota)
				cur = q.QuotaConfig
			})
			if exists && cur == want {
				t.configured[c.Quota] = want
				continue
			}
			if !exists {
				// A grant creates it from its own Config; a renewal of a
				// quota that is gone is answered lease expired, and the
				// holder's next grant creates it.
				continue
			}
			c.Now = now
			data, err := lease.EncodeCommand(c)
			if err != nil {
				n.logger.Error("cannot encode a quota configuration from the rules", "quota", c.Quota, "err", err)
				continue
			}
			configs = append(configs, commandOp(data))
			added = append(added, c)
		}
		size := opsSize(enc) + opsSize(configs)
		if len(b.props) > 0 && b.bytes+size > maxEntryBytes {
			return b, props[i:]
		}
		b.bytes += size
		for _, c := range added {
			t.configured[c.Quota] = c.Config()
			b.configured = append(b.configured, c.Quota)
		}
		b.ops = append(b.ops, configs...)
		b.offsets = append(b.offsets, len(b.ops))
		b.ops = append(b.ops, enc...)
		b.props = append(b.props, p)
		b.commands += len(enc)
	}
	if len(b.props) == 0 {
		return nil, nil
	}
	return b, nil
}

func opsSize(ops []op) int {
	n := 0
	for _, o := range ops {
		n += len(o.data) + 1 + binary.MaxVarintLen32
	}
	return n
}

// entryBuild is an inflight entry being laid out.
type entryBuild struct {
	inflight
	ops   []op
	bytes int
}

func (b *entryBuild) data() []byte { return encodeEntry(b.ops) }

func encodeProposal(p *proposal, now int64) ([]op, error) {
	ops := make([]op, len(p.ops))
	for i, o := range p.ops {
		if o.allow != nil {
			ops[i] = allowOp(o.allow.id, o.allow.mode)
			continue
		}
		if o.member != nil {
			ops[i] = memberOp(*o.member)
			if o.admin {
				ops[i] = adminOp(*o.member)
			}
			continue
		}
		data, err := lease.EncodeCommand(StampCommand(withConfig(o.cmd, p.configs), now))
		if err != nil {
			return nil, err
		}
		ops[i] = commandOp(data)
	}
	return ops, nil
}

// withConfig gives a Grant its quota's shape from configs, so that it
// creates the quota if the state machine has removed it (idle) since the
// shape was configured.
func withConfig(c lease.Command, configs []lease.ConfigureQuota) lease.Command {
	g, ok := c.(lease.Grant)
	if !ok || g.Config != nil {
		return c
	}
	for _, cq := range configs {
		if cq.Quota == g.Quota {
			cfg := cq.Config()
			g.Config = &cfg
			return g
		}
	}
	return c
}

// StampCommand sets the leader's timestamp on a command (the coordinator,
// and internal/sim's model of it).
func StampCommand(c lease.Command, now int64) lease.Command {
	switch v := c.(type) {
	case lease.Grant:
		v.Now = now
		return v
	case lease.Renew:
		v.Now = now
		return v
	case lease.Release:
		v.Now = now
		return v
	case lease.Tick:
		v.Now = now
		return v
	case lease.LeaderElected:
		v.Now = now
		return v
	case lease.ConfigureQuota:
		v.Now = now
		return v
	case lease.Fund:
		v.Now = now
		return v
	}
	return c
}

func (t *term) forget(quotas []string) {
	if len(quotas) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, q := range quotas {
		delete(t.configured, q)
	}
}

// failQueued answers everything still queued when the term ends.
func (n *Node) failQueued(t *term) {
	for {
		select {
		case p := <-t.queue:
			p.done <- proposalResult{err: ErrNotLeader}
		default:
			return
		}
	}
}

// respond waits for each entry in proposal order and answers its
// proposals from their own slice of the entry's results.
func (n *Node) respond(t *term) {
	defer n.wg.Done()
	for fl := range t.inflight {
		err := fl.future.Error()
		var res *ApplyResult
		if err == nil {
			switch r := fl.future.Response().(type) {
			case *ApplyResult:
				res = r
			case error:
				err = r
			default:
				err = fmt.Errorf("unexpected apply result %T", r)
			}
		}
		if err != nil {
			t.forget(fl.configured)
			if isLeadershipErr(err) {
				err = fmt.Errorf("%w: %w", ErrNotLeader, err)
			}
			n.m.entriesFailed.Inc()
			for _, p := range fl.props {
				p.done <- proposalResult{err: err}
			}
			continue
		}
		n.m.commitDuration.Observe(time.Since(fl.start).Seconds())
		n.m.batchCommands.Observe(float64(fl.commands))
		n.m.batchRequests.Observe(float64(len(fl.props)))
		for i, p := range fl.props {
			switch p.kind {
			case kindRenew:
				n.m.renewals.Inc()
			case kindRelease:
				n.m.releases.Inc()
			}
			start := fl.offsets[i]
			ops := res.Ops[start : start+len(p.ops)]
			if len(p.touched) > 0 {
				if last := ops[len(ops)-1]; !last.Result.Replayed && !errors.Is(last.Err, lease.ErrStale) {
					n.rebalance(p.touched, p.requester)
				}
			}
			p.done <- proposalResult{results: ops}
		}
	}
}

// tick proposes a Tick every TickInterval while the term lasts: expired
// leases are reclaimed and pools refilled even when nobody renews.
func (n *Node) tick(t *term) {
	defer n.wg.Done()
	tk := time.NewTicker(n.cfg.TickInterval)
	defer tk.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tk.C:
		}
		res, err := n.proposeIn(t.ctx, t, &proposal{ops: []pendingOp{{cmd: lease.Tick{}}}})
		if err != nil {
			if t.ctx.Err() == nil {
				n.logger.Warn("tick failed", "err", err)
			}
			continue
		}
		if r := res[0]; r.Err == nil && len(r.Result.Reclaimed) > 0 {
			n.m.reclaimed.Add(float64(len(r.Result.Reclaimed)))
			n.logger.Info("leases reclaimed after expiry", "count", len(r.Result.Reclaimed))
		}
	}
}

// isLeadershipErr reports Raft errors that mean "not (or no longer) the
// leader": the caller should retry at the leader.
func isLeadershipErr(err error) bool {
	return errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) ||
		errors.Is(err, raft.ErrLeadershipTransferInProgress) || errors.Is(err, raft.ErrRaftShutdown) ||
		errors.Is(err, raft.ErrAbortedByRestore)
}
