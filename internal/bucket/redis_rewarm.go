package bucket

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A topology change sends decisions to a node that has never served this
// store: a replica promoted by a Cluster failover, a master a resharding
// brought in. Its first decision would open its connection (TCP, and with
// rediss:// a TLS handshake) and find the scripts missing (a replica holds
// none: SCRIPT LOAD is not replicated) inside its decision timeout, and on
// a slow link fall to its rule's failure policy and count against a node
// that is healthy. So a master is warmed (scripts loaded, its pipeliner's
// and its pool's connections open) before it decides: by the agent's
// prober as soon as it reads a topology that names it (WarmNew), or else by
// the first decision routed to it, which waits for the warm-up on the
// warm-up budget (WarmTimeout) and then gets a fresh decision timeout.
// Only that first wave of decisions waits, once per new master.

// warmCause is what called for a new master's warm-up.
type warmCause int

const (
	causeNewMasterRead warmCause = iota
	causeNewMasterDecision
)

// String is the cause as logged.
func (c warmCause) String() string {
	if c == causeNewMasterRead {
		return "a topology read names a master not warmed yet (failover, resharding)"
	}
	return "the first decision routed to a master not warmed yet (failover, resharding, or a store used without Warm)"
}

// WarmupCounts are the warm-ups a store has done since it was made, by what
// called for them. Warm, the warm-up before the first decision, is not
// counted.
type WarmupCounts struct {
	// TopologyRead: a master a topology read named before any decision
	// went to it (WarmNew: the agent's prober, while a node is down).
	TopologyRead int64
	// FirstDecision: a master the first decision routed to found cold, and
	// waited for (no topology read had warmed it yet).
	FirstDecision int64
	// Outage: a node warmed again after an outage, before its breaker
	// closed (WarmNode).
	Outage int64
	// NoScript: a call found the scripts gone (NOSCRIPT: a restart, a
	// failover or SCRIPT FLUSH that no warm-up preceded) and reloaded them.
	NoScript int64
}

// nodeConn is one Cluster master's pipeliner and the state of its warm-up.
type nodeConn struct {
	ap *redis.AutoPipeliner
	// ready: its first warm-up has ended (successfully or not); until
	// then decisions wait on done.
	ready atomic.Bool
	done  chan struct{}
	once  sync.Once // starts the first warm-up
}

// nodeConn is master n's pipeliner and warm-up state, made at its first use.
func (s *RedisStore) nodeConn(n *redis.Client) (*nodeConn, error) {
	if v, ok := s.nodeAPs.Load(n); ok {
		return v.(*nodeConn), nil
	}
	// One pipeliner per client, cached by go-redis: concurrent first
	// uses of a master all get the same one. A call that loses the race
	// below must not close it: that would close the winner's too, and
	// every later decision on the master would fail ("client is closed").
	ap, err := n.AsyncAutoPipeline()
	if err != nil {
		return nil, err
	}
	if s.nodeConnHook != nil {
		s.nodeConnHook()
	}
	v, _ := s.nodeAPs.LoadOrStore(n, &nodeConn{ap: ap, done: make(chan struct{})})
	return v.(*nodeConn), nil
}

// startWarm runs nc's first warm-up once, in the background, on the
// warm-up budget: the decisions that find nc not ready wait for it
// (awaitWarm), and whoever starts it does not.
func (s *RedisStore) startWarm(n *redis.Client, nc *nodeConn, cause warmCause) {
	nc.once.Do(func() {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), s.warmTimeout)
			defer cancel()
			start := time.Now()
			err := s.warmNode(ctx, n, nc)
			if err == nil {
				// Counted before the waiters go on: a decision that waited
				// for this warm-up sees it in the count (tests, metrics).
				s.warmups[cause].Add(1)
			}
			s.endWarm(nc)
			addr := n.Options().Addr
			if err != nil {
				s.log.Warn("redis: warming a new master failed; its decisions go to it cold", "node", addr, "cause", cause.String(), "err", err)
				return
			}
			s.log.Info("redis: new master warmed before deciding on it (scripts loaded, connections open)", "node", addr, "cause", cause.String(), "took", time.Since(start).Round(time.Millisecond))
		}()
	})
}

// endWarm marks nc's first warm-up over (it may have been done by Warm).
func (s *RedisStore) endWarm(nc *nodeConn) {
	nc.once.Do(func() {}) // a warm-up done by Warm: none to start later
	if !nc.ready.Swap(true) {
		close(nc.done)
	}
}

// warmNode loads the scripts on master n and opens a connection of its
// pipeliner and of its pool, handshakes done, within ctx.
func (s *RedisStore) warmNode(ctx context.Context, n *redis.Client, nc *nodeConn) error {
	if err := s.loadScriptsOn(ctx, n.Options()); err != nil {
		return err
	}
	if err := nc.ap.Submit(ctx, redis.NewStatusCmd(ctx, "ping")).WaitContext(ctx); err != nil {
		return fmt.Errorf("ping through its pipeliner: %w", err)
	}
	// Batches (TakeBatch) and redirections go through the node's pool.
	if err := n.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}

// awaitWarm waits for the first warm-up of the master of key (on a Cluster
// whose decisions go through each master's pipeliner), starting it if need
// be. When it waited, it returns a fresh decision timeout for the call:
// the wait was warm-up, not the decision. cancel must be called.
func (s *RedisStore) awaitWarm(ctx context.Context, nc *nodeConn, n *redis.Client) (context.Context, context.CancelFunc) {
	if nc.ready.Load() {
		return ctx, noCancel
	}
	s.startWarm(n, nc, causeNewMasterDecision)
	<-nc.done // bounded by the warm-up's own timeout
	return context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
}

// awaitWarmKeys is awaitWarm for the masters of a batch's keys: those not
// warm yet are warmed (together) before the batch is sent.
func (s *RedisStore) awaitWarmKeys(ctx context.Context, reqs []Request) (context.Context, context.CancelFunc) {
	cc, ok := s.c.(*redis.ClusterClient)
	if !ok || !s.nodeAP {
		return ctx, noCancel
	}
	var cold []*nodeConn
	for i := range reqs {
		n, err := cc.MasterForKey(ctx, reqs[i].Key)
		if err != nil {
			continue
		}
		nc, err := s.nodeConn(n)
		if err != nil || nc.ready.Load() {
			continue
		}
		s.startWarm(n, nc, causeNewMasterDecision)
		cold = append(cold, nc)
	}
	if len(cold) == 0 {
		return ctx, noCancel
	}
	for _, nc := range cold {
		<-nc.done
	}
	return context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
}

// WarmNew warms every master of the Cluster's current topology that has
// not been warmed yet (none, on a store that is not a Cluster), and
// returns once each has been tried. It reads the topology (CLUSTER SLOTS,
// which go-redis then routes by): the agent's prober calls it while a
// node's breaker is open, when a failover may be promoting a replica.
// ctx bounds the topology read; the warm-ups have the warm-up budget.
func (s *RedisStore) WarmNew(ctx context.Context) error {
	cc, ok := s.c.(*redis.ClusterClient)
	if !ok || !s.nodeAP {
		return nil
	}
	var mu sync.Mutex
	var cold []*nodeConn
	err := cc.ForEachMaster(ctx, func(_ context.Context, n *redis.Client) error {
		nc, err := s.nodeConn(n)
		if err != nil || nc.ready.Load() {
			return err
		}
		s.startWarm(n, nc, causeNewMasterRead)
		mu.Lock()
		cold = append(cold, nc)
		mu.Unlock()
		return nil
	})
	for _, nc := range cold {
		<-nc.done
	}
	if err != nil {
		return s.fail("warm new masters", err)
	}
	return nil
}

// WarmNode warms one node again, as Warm does the whole store before the
// first decision: PrimaryNode (a single primary, or a Sentinel-managed one)
// or a Cluster master by address. The agent calls it when a node whose
// breaker is open answers again, before the breaker closes: a restarted
// or newly elected primary holds no scripts, and every connection to it
// has to be made again. ctx bounds it (the warm-up budget). A Cluster
// address that is not a master now fails with ErrUnknownNode.
func (s *RedisStore) WarmNode(ctx context.Context, node string) error {
	cc, ok := s.c.(*redis.ClusterClient)
	if !ok || node == PrimaryNode {
		err := s.Warm(ctx, WarmConns)
		if err == nil {
			s.outageWarmups.Add(1)
		}
		return err
	}
	if node == UnservedNode {
		return nil
	}
	var found atomic.Bool
	err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		if n.Options().Addr != node {
			return nil
		}
		found.Store(true)
		if !s.nodeAP {
			if err := s.loadScriptsOn(ctx, n.Options()); err != nil {
				return err
			}
			return n.Ping(ctx).Err()
		}
		nc, err := s.nodeConn(n)
		if err != nil {
			return err
		}
		err = s.warmNode(ctx, n, nc)
		if err == nil {
			s.endWarm(nc)
		}
		return err
	})
	if err == nil && found.Load() {
		s.outageWarmups.Add(1)
	}
	switch {
	case err != nil:
		return s.fail("warm "+node, err)
	case !found.Load():
		return fmt.Errorf("%w: %s", ErrUnknownNode, node)
	}
	return nil
}

// Warmups counts the new masters warmed after a topology change (by
// WarmNew or by the first decision routed to them), not those Warm and
// WarmNode warmed.
func (s *RedisStore) Warmups() int64 {
	return s.warmups[causeNewMasterRead].Load() + s.warmups[causeNewMasterDecision].Load()
}

// WarmupCounts reports the store's warm-ups by cause.
func (s *RedisStore) WarmupCounts() WarmupCounts {
	return WarmupCounts{
		TopologyRead:  s.warmups[causeNewMasterRead].Load(),
		FirstDecision: s.warmups[causeNewMasterDecision].Load(),
		Outage:        s.outageWarmups.Load(),
		NoScript:      s.rewarms.Load(),
	}
}
