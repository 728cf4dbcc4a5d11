package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ration-dev/ration/internal/breaker"
	"github.com/ration-dev/ration/internal/bucket"
)

// A store of several nodes (a Redis Cluster's masters) fails node by node:
// one master down leaves the others deciding. Each node has its own
// circuit breaker, prober and outage episode, so a decision on a dead
// master's slot gets its rule's failure policy at once once that node's
// breaker is open, while decisions on the other masters' slots keep going
// to Redis at their usual speed; an emergency allowance is measured from
// the start of the outage of the node its bucket lives on. A single
// primary (or a Sentinel-managed one, or the memory store) is one node,
// bucket.PrimaryNode, as before.

// nodeStore is the optional part of Store that spreads its keys over nodes
// that fail independently (bucket.RedisStore on a Cluster).
type nodeStore interface {
	Sharded() bool
	// NodeOf names the node that decides key now (no I/O).
	NodeOf(ctx context.Context, key string) string
	// PingNode checks one node; bucket.ErrUnknownNode: it is no longer
	// part of the store (its slots moved away).
	PingNode(ctx context.Context, node string) error
	// Topology lists the nodes and their slots (I/O).
	Topology(ctx context.Context) ([]bucket.NodeSlots, error)
}

// unknownNode stands for a slot whose owner go-redis could never name (no
// topology loaded yet): probed by pinging the whole store.
const unknownNode = "unknown"

// storeNode is one node of the store: its breaker and its outage episode.
type storeNode struct {
	name string
	br   *breaker.Breaker
	// episodeStart is the unix nanos of the first failure of the node's
	// current outage; 0 while it answers.
	episodeStart atomic.Int64
	// lastErr is the node's last failure (a string), the cause an
	// activation line names.
	lastErr atomic.Value
	// acts: the store rules that fell to their policy on this node in its
	// current episode (logged once each).
	acts activations
	// round: the prober's round in which the node first routed a
	// decision, until that round has ended (nil after). See beginRound.
	round atomic.Pointer[chan struct{}]
}

// storeNodes are the store's nodes, found by name.
type storeNodes struct {
	cfg     breaker.Config
	logger  *slog.Logger
	metrics *metrics
	router  nodeStore  // nil: one node
	single  *storeNode // the one node when router is nil

	mu     sync.Mutex                            // serialises adding and removing nodes
	byName atomic.Pointer[map[string]*storeNode] // copy on write
	open   atomic.Int32                          // nodes whose breaker is open
	down   atomic.Int32                          // nodes in an outage episode
	// topo is the Cluster's last topology the prober read, for /readyz.
	topo atomic.Pointer[[]bucket.NodeSlots]
	// round is the prober's round in progress on a Cluster, closed when
	// it ends (nil between rounds).
	round atomic.Pointer[chan struct{}]
}

func newStoreNodes(store Store, cfg breaker.Config, logger *slog.Logger, m *metrics) *storeNodes {
	ns := &storeNodes{cfg: cfg, logger: logger, metrics: m}
	empty := map[string]*storeNode{}
	ns.byName.Store(&empty)
	if r, ok := store.(nodeStore); ok && r.Sharded() {
		ns.router = r
		return ns
	}
	ns.single = ns.get(bucket.PrimaryNode)
	return ns
}

// of is the node that decides key.
func (ns *storeNodes) of(ctx context.Context, key string) *storeNode {
	if ns.single != nil {
		return ns.single
	}
	name := ns.router.NodeOf(ctx, key)
	if name == "" {
		name = unknownNode
	}
	if n := (*ns.byName.Load())[name]; n != nil {
		return n
	}
	return ns.get(name)
}

// get returns the node named, adding it (a master not seen before: a new
// node, or a replica promoted in a failover) if need be.
func (ns *storeNodes) get(name string) *storeNode {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	old := *ns.byName.Load()
	if n := old[name]; n != nil {
		return n
	}
	n := &storeNode{name: name}
	if r := ns.round.Load(); r != nil {
		n.round.Store(r)
	}
	n.br = breaker.New(ns.cfg, func(t breaker.Transition) { ns.transition(n, t) })
	m := make(map[string]*storeNode, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[name] = n
	ns.byName.Store(&m)
	ns.metrics.breakerNodeOpen.WithLabelValues(name).Set(0)
	ns.metrics.fallbackNodeActive.WithLabelValues(name).Set(0)
	return n
}

// A master a failover promotes (or a resharding brings in) is routed to
// from the moment go-redis reads a topology that names it. While a node is
// down that read is the prober's own (its ping of the node reads the
// topology again), and the prober then warms the masters it names
// (WarmNew). A decision routed to such a master in between would find it
// cold and make the warm-up itself; so a node first seen during a prober's
// round waits for the round's end (its warm-up, bounded by the warm-up
// budget) before its first decisions go to it. Routing changed by another
// read (go-redis's own, after a redirection) is not in a round: its first
// decision warms the master, as the store does for a store with no prober.

// beginRound starts a prober's round on a Cluster (one while a node is
// down); end must be called.
func (ns *storeNodes) beginRound() (end func()) {
	if ns.router == nil {
		return func() {}
	}
	ch := make(chan struct{})
	ns.round.Store(&ch)
	return func() {
		ns.round.Store(nil)
		close(ch)
	}
}

// awaitRound waits, for a node first seen during a prober's round, until
// that round has ended (or ctx is done).
func (n *storeNode) awaitRound(ctx context.Context) {
	r := n.round.Load()
	if r == nil {
		return
	}
	select {
	case <-*r:
		n.round.CompareAndSwap(r, nil)
	case <-ctx.Done():
	}
}

// retire forgets a node that left the store's topology: no slot routes to
// it any more, and its series go with it.
func (ns *storeNodes) retire(n *storeNode, why error) {
	ns.mu.Lock()
	old := *ns.byName.Load()
	if old[n.name] != n {
		ns.mu.Unlock()
		return
	}
	m := make(map[string]*storeNode, len(old))
	for k, v := range old {
		if k != n.name {
			m[k] = v
		}
	}
	ns.byName.Store(&m)
	ns.mu.Unlock()
	if n.br.State() == breaker.Open {
		ns.setOpen(-1)
	}
	if n.episodeStart.Swap(0) != 0 {
		ns.setDown(-1)
	}
	ns.metrics.breakerNodeOpen.DeleteLabelValues(n.name)
	ns.metrics.fallbackNodeActive.DeleteLabelValues(n.name)
	ns.logger.Info("store node left the topology: its slots are decided by their new owner", "node", n.name, "cause", why)
}

// all is every node, in no particular order.
func (ns *storeNodes) all() []*storeNode {
	m := *ns.byName.Load()
	out := make([]*storeNode, 0, len(m))
	for _, n := range m {
		out = append(out, n)
	}
	return out
}

func (ns *storeNodes) transition(n *storeNode, t breaker.Transition) {
	if t.To == breaker.Open {
		ns.setOpen(1)
		ns.metrics.breakerNodeOpen.WithLabelValues(n.name).Set(1)
		ns.logger.Warn("store circuit breaker open: decisions on this node stop waiting for it", "node", n.name, "consecutive_failures", ns.cfg.Threshold)
		return
	}
	ns.setOpen(-1)
	ns.metrics.breakerNodeOpen.WithLabelValues(n.name).Set(0)
	ns.logger.Info("store circuit breaker closed", "node", n.name, "open_for", t.At.Sub(t.Since).Round(time.Millisecond))
}

// setOpen keeps ration_breaker_open at 1 while any node's breaker is open.
func (ns *storeNodes) setOpen(d int32) {
	v := 0.0
	if ns.open.Add(d) > 0 {
		v = 1
	}
	ns.metrics.breakerOpen.Set(v)
}

// setDown keeps ration_fallback_active at 1 while any node is in an
// outage episode.
func (ns *storeNodes) setDown(d int32) {
	v := 0.0
	if ns.down.Add(d) > 0 {
		v = 1
	}
	ns.metrics.fallbackActive.Set(v)
}

// failure records that the node could not decide, err saying why. The
// first failure of an episode is logged with its cause: a store that
// refuses the agent's credentials is not a store that is down, and the
// operator fixes the one in -redis, not the network.
func (ns *storeNodes) failure(n *storeNode, now time.Time, err error) {
	n.br.Failure(now)
	if err != nil {
		n.lastErr.Store(err.Error())
	}
	if n.episodeStart.CompareAndSwap(0, now.UnixNano()) {
		msg := "store unreachable: failure policies in force"
		if errors.Is(err, bucket.ErrAuth) {
			msg = "store refused the agent's credentials (authentication failed): failure policies in force"
		}
		ns.logger.Warn(msg, "node", n.name, "since", now, "err", err)
		ns.metrics.fallbackNodeActive.WithLabelValues(n.name).Set(1)
		ns.setDown(1)
	}
}

// success records that the node answered: it closes its breaker's count
// and ends its episode.
func (ns *storeNodes) success(n *storeNode, now time.Time) {
	n.br.Success(now)
	if n.episodeStart.Load() == 0 {
		return
	}
	start := n.episodeStart.Swap(0)
	if start == 0 {
		return
	}
	decided := n.acts.reset()
	ns.metrics.fallbackNodeActive.WithLabelValues(n.name).Set(0)
	ns.setDown(-1)
	ns.logger.Info("store reachable again: failure policies lifted", "node", n.name,
		"outage", now.Sub(time.Unix(0, start)).Round(time.Millisecond), "fallback_decisions", decided)
}

// since is how long the node's current outage has lasted (0: none).
func (n *storeNode) since(now time.Time) time.Duration {
	start := n.episodeStart.Load()
	if start == 0 {
		return 0
	}
	return now.Sub(time.Unix(0, start))
}

// cause is the node's last failure, for an activation line.
func (n *storeNode) cause() string {
	if e, _ := n.lastErr.Load().(string); e != "" {
		return e
	}
	return "no answer within -decision-timeout"
}

// probe pings each node whose breaker is open and due, closing it on an
// answer; a node that left the topology is retired. While a node is open,
// the Cluster's topology is read again for /readyz.
func (s *Service) probe(ctx context.Context, lastTopo *time.Time) {
	ns := s.nodes
	anyOpen := false
	var due []*storeNode
	for _, n := range ns.all() {
		if n.br.State() == breaker.Open {
			anyOpen = true
		}
		if n.br.ProbeDue(time.Now()) {
			due = append(due, n)
		}
	}
	topoDue := ns.router != nil && time.Since(*lastTopo) >= s.cfg.Breaker.ProbeInterval && (anyOpen || lastTopo.IsZero())
	if len(due) == 0 && !topoDue {
		return
	}
	if anyOpen {
		end := ns.beginRound()
		defer end()
	}
	for _, n := range due {
		err := s.probeNode(ctx, n)
		if err == nil {
			err = s.warmNode(ctx, n)
		}
		switch {
		case err == nil:
			ns.success(n, time.Now())
		case errors.Is(err, bucket.ErrUnknownNode):
			ns.retire(n, err)
		default:
			n.lastErr.Store(err.Error())
		}
	}
	if topoDue {
		*lastTopo = time.Now()
		tctx, cancel := context.WithTimeout(ctx, s.cfg.DecisionTimeout)
		if t, err := ns.router.Topology(tctx); err == nil {
			ns.topo.Store(&t)
		}
		cancel()
	}
	// A node is down: a failover may be promoting a replica, which this
	// round's reads of the topology (each ping of a node reads it again)
	// may have just brought in. It is warmed before the round ends, and
	// so before its first decisions (beginRound).
	if w, ok := s.store.(nodeWarmer); ok && ns.router != nil && anyOpen {
		wctx, cancel := context.WithTimeout(ctx, s.warmTimeout())
		if err := w.WarmNew(wctx); err != nil {
			ns.logger.Debug("warming new masters failed", "err", err)
		}
		cancel()
	}
}

// nodeWarmer is the optional part of Store that warms a node before
// decisions go to it (bucket.RedisStore): a connection made and the
// scripts loaded by a decision would be paid inside its timeout.
type nodeWarmer interface {
	// WarmNode warms one node (bucket.PrimaryNode, or a Cluster master).
	WarmNode(ctx context.Context, node string) error
	// WarmNew warms the masters a topology change brought in.
	WarmNew(ctx context.Context) error
}

// warmTimeout bounds a warm-up: a TLS handshake and a script load, not a
// decision.
func (s *Service) warmTimeout() time.Duration {
	return max(bucket.DefaultWarmTimeout, s.cfg.DecisionTimeout)
}

// warmNode warms a node whose breaker is open and which has just answered
// a probe, before its breaker closes: a restarted primary, the new primary
// of a Sentinel failover, a Cluster master back at its address hold no
// scripts and none of the agent's connections, and the first decisions
// after the breaker closes would make them inside their own timeout. A
// warm-up that fails keeps the breaker open, as a failed probe does.
func (s *Service) warmNode(ctx context.Context, n *storeNode) error {
	w, ok := s.store.(nodeWarmer)
	if !ok || n.name == unknownNode || n.name == bucket.UnservedNode {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.warmTimeout())
	defer cancel()
	if err := w.WarmNode(ctx, n.name); err != nil {
		return fmt.Errorf("warm-up after the outage: %w", err)
	}
	s.logger.Info("store node warmed before its breaker closes (scripts loaded, connections open)", "node", n.name, "cause", "it answered a probe after an outage")
	return nil
}

func (s *Service) probeNode(ctx context.Context, n *storeNode) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DecisionTimeout)
	defer cancel()
	if s.nodes.router == nil || n.name == unknownNode {
		return s.store.Ping(ctx)
	}
	return s.nodes.router.PingNode(ctx, n.name)
}

// NodeStatus is one store node's state, for /readyz.
type NodeStatus struct {
	Node      string
	Open      bool
	OpenSince time.Time
	Slots     [][2]int // the node's slots in the last topology read (a Cluster's)
}

// StoreNodes reports each node the agent has decided on, by name.
func (s *Service) StoreNodes() []NodeStatus {
	var slots map[string][][2]int
	if t := s.nodes.topo.Load(); t != nil {
		slots = make(map[string][][2]int, len(*t))
		for _, n := range *t {
			slots[n.Node] = n.Slots
		}
	}
	var out []NodeStatus
	for _, n := range s.nodes.all() {
		st := NodeStatus{Node: n.name, Open: n.br.State() == breaker.Open, OpenSince: n.br.OpenSince(), Slots: slots[n.name]}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b NodeStatus) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// nodesDetail is the store nodes' part of /readyz: one line a node, when
// the store has several or one is down.
func (s *Service) nodesDetail(now time.Time) string {
	nodes := s.StoreNodes()
	if s.nodes.router == nil && s.nodes.open.Load() == 0 {
		return ""
	}
	var b strings.Builder
	for _, n := range nodes {
		if !n.Open {
			fmt.Fprintf(&b, "store node %s: ok\n", n.Node)
			continue
		}
		fmt.Fprintf(&b, "store node %s: breaker open for %v: its decisions follow their rules' failure policies", n.Node, now.Sub(n.OpenSince).Round(time.Millisecond))
		if len(n.Slots) > 0 {
			b.WriteString(" (slots " + slotRanges(n.Slots) + ")")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func slotRanges(rs [][2]int) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		if r[0] == r[1] {
			parts[i] = fmt.Sprint(r[0])
		} else {
			parts[i] = fmt.Sprintf("%d-%d", r[0], r[1])
		}
	}
	return strings.Join(parts, ",")
}
