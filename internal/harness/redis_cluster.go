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

// Cluster is a Redis Cluster of three masters without replicas, on loopback.
// Node i owns the slots from Slots[i][0] to Slots[i][1], inclusive. Needs
// Redis >= 7.0 (cluster-port, CLUSTER ADDSLOTSRANGE).
type Cluster struct {
	Addrs    []string
	TLSAddrs []string // the nodes' TLS ports (StartCluster WithTLS)
	Nodes    []*Redis
	Slots    [][2]int

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
	for i := 0; i < n; i++ {
		rc := redisConfig{cluster: true}
		for _, o := range opts {
			o(&rc)
		}
		rc.lines = append(rc.lines, "cluster-node-timeout 2000")
		if rc.tls != nil {
			rc.lines = append(rc.lines, "tls-cluster yes", "tls-replication yes")
		}
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
	for _, node := range c.Nodes {
		waitFor(ctx, t, "cluster node "+node.Addr+" ready", func() (bool, string) {
			info, err := node.Client().ClusterInfo(ctx).Result()
			if err != nil {
				return false, err.Error()
			}
			state, known := infoField(info, "cluster_state"), infoField(info, "cluster_known_nodes")
			return state == "ok" && known == strconv.Itoa(n),
				fmt.Sprintf("cluster_state:%s cluster_known_nodes:%s", state, known)
		})
	}
	return c
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
