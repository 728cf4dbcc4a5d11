package bound

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/ration-dev/ration/internal/harness"
)

// redisNode is one redis-server of the store, on a clock of its own; a
// replica replicates through a proxy (link), so that its link can be cut
// for certain: a replica merely stopped still finds, once resumed, what
// the dead primary had sent into its socket.
type redisNode struct {
	srv   *harness.Redis
	clock *harness.RedisClock
	link  *harness.Proxy // to its primary; nil for the primary
}

// failover is one Redis failover that lost a suffix of writes: the
// replica's link was cut at Cut, the primary killed and the replica
// promoted and the agents' proxy moved to it by Promoted. Every write
// acknowledged in between is lost (Lost bytes of the replication stream).
type failover struct {
	Cut, Promoted time.Duration
	Lost          int64
}

// clockStep is a forward step, by D at At, of the clock of the server the
// agents reach: a step of the primary's clock, or a failover to a replica
// whose clock runs ahead of the old primary's.
type clockStep struct {
	At, D time.Duration
}

// startStore starts the primary, its replica and the agents' proxy to the
// primary.
func (w *world) startStore() {
	w.primary = w.startRedisNode("")
	w.replica = w.startRedisNode(w.primary.srv.Addr)
	w.redisPx = harness.NewProxy(w.t, w.primary.srv.Addr)
}

// startRedisNode starts a server on a clock at offset 0, a replica of
// primary through a proxy of its own unless primary is "".
func (w *world) startRedisNode(primary string) *redisNode {
	t := w.t
	n := &redisNode{clock: harness.NewRedisClock(t)}
	// Every server may become a primary: a replica's full sync is sent at
	// once, not after the default 5s wait for other replicas.
	opts := []harness.RedisOption{harness.WithClock(t, n.clock), harness.WithConfig("repl-diskless-sync-delay 0")}
	if primary != "" {
		n.link = harness.NewProxy(t, primary)
		opts = append(opts, harness.WithReplicaOf(n.link.Addr()))
	}
	n.srv = harness.StartRedis(t, opts...)
	return n
}

// replicationOffset reads a server's offset in the replication stream:
// what it has written (a primary) or received (a replica); -1 if it does
// not answer.
func replicationOffset(n *redisNode, field string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := n.srv.Client().Info(ctx, "replication").Result()
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			if off, err := strconv.ParseInt(v, 10, 64); err == nil {
				return off
			}
		}
	}
	return -1
}

func inSync(n *redisNode) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := n.srv.Client().Info(ctx, "replication").Result()
	return err == nil && strings.Contains(info, "master_link_status:up")
}

// redisFailover cuts the replica's link, and after 0.2 to 1.5 s (the lost
// writes' window: every agent decision on Redis meanwhile is acknowledged
// by the primary alone) kills the primary, promotes the replica
// (REPLICAOF NO ONE), moves the agents' proxy to it and starts a new
// replica. It returns the step that ends it, or nil if the replica is not
// in sync (a failover is under way, or the new replica's sync is).
func (w *world) redisFailover() []pending {
	if w.failingOver || !inSync(w.replica) {
		return nil
	}
	w.failingOver = true
	w.replica.link.Blackhole()
	cut := w.now()
	w.event("redis: the replica's link cut (every write from now on is lost at the failover)")
	return []pending{{at: cut + w.between(200*time.Millisecond, 1500*time.Millisecond), do: func() {
		old, next := w.primary, w.replica
		written, received := replicationOffset(old, "master_repl_offset"), replicationOffset(next, "slave_repl_offset")
		old.srv.Kill()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := next.srv.Client().Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
			w.t.Fatalf("redis failover: REPLICAOF NO ONE: %v", err)
		}
		w.redisPx.Retarget(next.srv.Addr)
		f := failover{Cut: cut, Promoted: w.now(), Lost: written - received}
		if written < 0 || received < 0 {
			f.Lost = -1 // not known
		}
		w.primary = next
		// The agents' server is now one whose clock may run ahead of the
		// old one's: a forward step of their store's clock.
		d := next.clock.Offset() - old.clock.Offset()
		w.mu.Lock()
		w.failovers = append(w.failovers, f)
		if d > 0 {
			w.steps = append(w.steps, clockStep{At: f.Promoted, D: d})
		}
		w.mu.Unlock()
		w.event("redis: primary killed, replica promoted and the agents' proxy moved to it: %v of writes lost (%d bytes of the replication stream), its clock %v ahead of the old primary's",
			(f.Promoted - f.Cut).Round(time.Millisecond), f.Lost, d.Round(time.Millisecond))
		w.replica = w.startRedisNode(next.srv.Addr)
		w.failingOver = false
	}}}
}

// stepClock steps the clock of the primary (7 times in 10) or of the
// replica by 0.1 to 0.8 s forward, or back to the machine's if it is
// ahead: a forward step of the primary's is one the judge allows for
// (r d more in windows holding it, docs/failure-policies.md); a
// replica's counts at its promotion.
func (w *world) stepClock() {
	n, which := w.primary, "primary"
	if w.rnd.IntN(10) >= 7 {
		n, which = w.replica, "replica"
	}
	from := n.clock.Offset()
	to := time.Duration(0)
	if from <= 0 {
		to = w.between(100*time.Millisecond, 800*time.Millisecond)
	}
	n.clock.Set(to)
	at := w.now()
	if which == "primary" && to > from {
		w.mu.Lock()
		w.steps = append(w.steps, clockStep{At: at, D: to - from})
		w.mu.Unlock()
	}
	w.event("redis: the %s's clock stepped from %v to %v ahead", which, from.Round(time.Millisecond), to.Round(time.Millisecond))
}
