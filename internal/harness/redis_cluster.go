package harness

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const clusterReadyTimeout = 30 * time.Second

// Cluster is a Redis Cluster of three masters, on loopback, with a replica
// each when started WithClusterReplicas. Master i owns the slots from
// Slots[i][0] to Slots[i][1], inclusive, until a failover gives them to
// Replicas[i]. Needs Redis >= 7.0 (cluster-port, CLUSTER ADDSLOTSRANGE).
type Cluster struct {
	Addrs    []string
	TLSAddrs []string // the nodes' TLS ports (StartCluster WithTLS)
	Nodes    []*Redis
	Slots    [][2]int
	// Replicas[i] replicates Nodes[i] (WithClusterReplicas; else empty).
	// Addrs lists only the masters: a client finds the rest.
	Replicas []*Redis

	t          testing.TB
	clientOnce sync.Once
	client     *redis.ClusterClient
}

// StartCluster starts three cluster-enabled servers, splits the 16384 slots
// evenly among them, joins them with CLUSTER MEET and returns once every
// node reports cluster_state:ok and knows all three.
//
// opts apply to every node. With WithTLS the nodes also speak TLS to each
// other (tls-cluster yes) and answer CLUSTER SLOTS with their TLS ports and
// IP addresses, as a TLS Cluster hands out its nodes; TLSAddrs lists them.
func StartCluster(t testing.TB, opts ...RedisOption) *Cluster {
	t.Helper()
	const n = 3
	c := &Cluster{t: t}
	rc := redisConfig{cluster: true}
	for _, o := range opts {
		o(&rc)
	}
	rc.lines = append(rc.lines, "cluster-node-timeout 2000")
	if rc.tls != nil {
		rc.lines = append(rc.lines, "tls-cluster yes", "tls-replication yes")
	}
	for i := 0; i < n; i++ {
		node := startRedis(t, rc)
		c.Nodes = append(c.Nodes, node)
		c.Addrs = append(c.Addrs, node.Addr)
		if node.TLSAddr != "" {
			c.TLSAddrs = append(c.TLSAddrs, node.TLSAddr)
		}
		c.Slots = append(c.Slots, [2]int{i * 16384 / n, (i+1)*16384/n - 1})
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	for i, node := range c.Nodes {
		lo, hi := c.Slots[i][0], c.Slots[i][1]
		if err := node.Client().Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatalf("harness: cluster addslotsrange %d %d on %s: %v", lo, hi, node.Addr, err)
		}
	}
	for _, node := range c.Nodes[1:] {
		err := c.Nodes[0].Client().Do(ctx, "CLUSTER", "MEET", "127.0.0.1", node.Port, node.busPort).Err()
		if err != nil {
			t.Fatalf("harness: cluster meet %s: %v", node.Addr, err)
		}
	}
	c.waitKnown(ctx, c.Nodes, n)
	if rc.replicas {
		c.addReplicas(ctx, rc)
	}
	return c
}

// WithClusterReplicas gives each of StartCluster's masters a replica,
// which the Cluster promotes when its master fails (after
// cluster-node-timeout, 2s, and an election).
func WithClusterReplicas() RedisOption {
	return func(c *redisConfig) { c.replicas = true }
}

// waitKnown waits until every node in nodes reports cluster_state:ok and
// knows known nodes.
func (c *Cluster) waitKnown(ctx context.Context, nodes []*Redis, known int) {
	c.t.Helper()
	for _, node := range nodes {
		waitFor(ctx, c.t, "cluster node "+node.Addr+" ready", func() (bool, string) {
			info, err := node.Client().ClusterInfo(ctx).Result()
			if err != nil {
				return false, err.Error()
			}
			state, k := infoField(info, "cluster_state"), infoField(info, "cluster_known_nodes")
			return state == "ok" && k == strconv.Itoa(known),
				fmt.Sprintf("cluster_state:%s cluster_known_nodes:%s", state, k)
		})
	}
}

// addReplicas starts one replica per master, joins it and waits until
// each replica's link to its master is up.
func (c *Cluster) addReplicas(ctx context.Context, rc redisConfig) {
	t := c.t
	t.Helper()
	for range c.Nodes {
		r := startRedis(t, rc)
		if err := c.Nodes[0].Client().Do(ctx, "CLUSTER", "MEET", "127.0.0.1", r.Port, r.busPort).Err(); err != nil {
			t.Fatalf("harness: cluster meet replica %s: %v", r.Addr, err)
		}
		c.Replicas = append(c.Replicas, r)
	}
	all := append(append([]*Redis{}, c.Nodes...), c.Replicas...)
	c.waitKnown(ctx, all, len(all))
	for i, m := range c.Nodes {
		id, err := m.Client().Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatalf("harness: cluster myid on %s: %v", m.Addr, err)
		}
		r := c.Replicas[i]
		// The replica may not have heard of its master's id yet (gossip):
		// ask again until it has.
		waitFor(ctx, t, "replica "+r.Addr+" of "+m.Addr, func() (bool, string) {
			if err := r.Client().Do(ctx, "CLUSTER", "REPLICATE", id).Err(); err != nil {
				return false, err.Error()
			}
			return true, ""
		})
	}
	for _, r := range c.Replicas {
		waitFor(ctx, t, "replica "+r.Addr+" in sync", func() (bool, string) {
			info, err := r.Client().Info(ctx, "replication").Result()
			if err != nil {
				return false, err.Error()
			}
			link := infoField(info, "master_link_status")
			return link == "up", "master_link_status:" + link
		})
	}
	c.waitKnown(ctx, all, len(all))
}

// WaitPromoted waits until the Cluster has promoted Replicas[i] (its
// master failed) and it serves the slots as a master; it returns the new
// master's address.
func (c *Cluster) WaitPromoted(ctx context.Context, i int) (string, error) {
	r := c.Replicas[i]
	for {
		info, err := r.Client().Info(ctx, "replication").Result()
		if err == nil && infoField(info, "role") == "master" {
			ci, err := r.Client().ClusterInfo(ctx).Result()
			if err == nil && infoField(ci, "cluster_state") == "ok" {
				return r.Addr, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("harness: replica %s of %s not promoted: %w", r.Addr, c.Nodes[i].Addr, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Client returns a cluster client over all nodes, for a test to inspect or
// set up state; it is closed when the test ends.
func (c *Cluster) Client() *redis.ClusterClient {
	c.clientOnce.Do(func() {
		c.client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
		c.t.Cleanup(func() { _ = c.client.Close() })
	})
	return c.client
}

// NodeForSlot returns the node that owns slot.
func (c *Cluster) NodeForSlot(slot int) *Redis {
	for i, s := range c.Slots {
		if slot >= s[0] && slot <= s[1] {
			return c.Nodes[i]
		}
	}
	return nil
}

// SubjectOn finds a subject (prefix and a number) whose key lives on node
// i: slotOf is the hash slot of a subject's key as the store computes it
// (bucket.KeySlot of bucket.Key, which this package cannot import).
func (c *Cluster) SubjectOn(t testing.TB, i int, prefix string, slotOf func(subject string) int) string {
	t.Helper()
	for n := range 10000 {
		s := prefix + strconv.Itoa(n)
		if c.NodeForSlot(slotOf(s)) == c.Nodes[i] {
			return s
		}
	}
	t.Fatalf("no subject %s<n> on cluster node %d", prefix, i)
	return ""
}
