package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
)

// A Cluster store names each key's master as the Cluster does (the slot
// KeySlot computes is the one CLUSTER KEYSLOT answers), pings one master
// at a time, refuses a node that is not a master, and lists the masters'
// slots; a single server is one node, PrimaryNode.
func TestClusterNodes(t *testing.T) {
	cl, s := clusterStore(t)
	ctx := context.Background()
	if !s.Sharded() {
		t.Fatal("a Cluster store is not Sharded")
	}
	keys := []string{"plain", "{}", "{", "a{b}c", "a{}b{c}", bucket.Key("r", "s"), bucket.HotKey("r", "é")}
	for i := range 50 {
		keys = append(keys, bucket.Key("rule", fmt.Sprint(i)))
	}
	for _, k := range keys {
		want, err := cl.Client().ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := bucket.KeySlot(k); got != int(want) {
			t.Errorf("KeySlot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
		if got, node := s.NodeOf(ctx, k), cl.NodeForSlot(int(want)).Addr; got != node {
			t.Errorf("NodeOf(%q) = %q, want %q (slot %d)", k, got, node, want)
		}
	}
	for _, a := range cl.Addrs {
		if err := s.PingNode(ctx, a); err != nil {
			t.Errorf("PingNode(%s): %v", a, err)
		}
	}
	if err := s.PingNode(ctx, "127.0.0.1:1"); !errors.Is(err, bucket.ErrUnknownNode) {
		t.Errorf("PingNode of a stranger = %v, want ErrUnknownNode", err)
	}
	topo, err := s.Topology(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range cl.Addrs {
		j := slices.IndexFunc(topo, func(n bucket.NodeSlots) bool { return n.Node == a })
		if j < 0 || !slices.Equal(topo[j].Slots, [][2]int{cl.Slots[i]}) {
			t.Errorf("Topology = %+v, want %s with slots %v", topo, a, cl.Slots[i])
		}
	}

	r := harness.StartRedis(t)
	one, err := bucket.OpenRedis(r.Addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { one.Close() })
	single := bucket.NewRedisStore(one, bucket.RedisOptions{Timeout: time.Second})
	if single.Sharded() || single.NodeOf(ctx, "k") != bucket.PrimaryNode || single.PingNode(ctx, bucket.PrimaryNode) != nil {
		t.Errorf("a single server: Sharded %v, NodeOf %q, want one node %q that answers", single.Sharded(), single.NodeOf(ctx, "k"), bucket.PrimaryNode)
	}
}

// A slot moved to another master after go-redis read the topology: the
// decision sent to its old master, answered MOVED, is decided by the new
// one, and NodeOf then names the new one.
func TestClusterSlotMoved(t *testing.T) {
	cl, s := clusterStore(t)
	ctx := context.Background()
	var key string
	for i := 0; ; i++ {
		key = bucket.Key("moved", fmt.Sprint(i))
		if cl.NodeForSlot(bucket.KeySlot(key)) == cl.Nodes[0] {
			break
		}
	}
	req := bucket.Request{Key: key, Limit: bucket.Limit{Burst: 10, Rate: 1}, Cost: 1}
	if _, err := s.Take(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := s.NodeOf(ctx, key); got != cl.Addrs[0] {
		t.Fatalf("NodeOf before the move = %s, want %s", got, cl.Addrs[0])
	}
	slot := bucket.KeySlot(key)
	// The slot holds the bucket: empty it, then give it to node 1 on every
	// node (the Cluster's own way for an empty slot).
	if err := cl.Nodes[0].Client().Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	id, err := cl.Nodes[1].Client().Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range cl.Nodes {
		if err := n.Client().Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", id).Err(); err != nil {
			t.Fatalf("setslot on %s: %v", n.Addr, err)
		}
	}
	res, err := s.Take(ctx, req)
	if err != nil || res.Remaining != 9 {
		t.Fatalf("Take after the move = %+v, %v; want decided by the new master (9 left)", res, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.NodeOf(ctx, key) != cl.Addrs[1] {
		if time.Now().After(deadline) {
			t.Fatalf("NodeOf after the move = %s, want %s", s.NodeOf(ctx, key), cl.Addrs[1])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// clusterStore starts a Cluster and opens a store on it as the agent does.
func clusterStore(t *testing.T) (*harness.Cluster, *bucket.RedisStore) {
	t.Helper()
	cl := harness.StartCluster(t)
	client, err := bucket.OpenRedis("redis-cluster://"+strings.Join(cl.Addrs, ","), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return cl, bucket.NewRedisStore(client, bucket.RedisOptions{Timeout: time.Second})
}
