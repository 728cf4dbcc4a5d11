package harness

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestRedisLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := StartRedis(t, WithConfig("maxmemory-policy allkeys-lru"))
	c := r.Client()
	if got, err := c.ConfigGet(ctx, "maxmemory-policy").Result(); err != nil || got["maxmemory-policy"] != "allkeys-lru" {
		t.Fatalf("maxmemory-policy = %v, %v; want allkeys-lru from WithConfig", got, err)
	}
	if got, err := c.ConfigGet(ctx, "save").Result(); err != nil || got["save"] != "" {
		t.Fatalf("save = %q, %v; want persistence off", got["save"], err)
	}
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}

	r.Pause()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := c.Ping(short).Err()
	cancel()
	if err == nil {
		t.Fatalf("PING answered while paused")
	}
	r.Resume()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after resume: %v", err)
	}

	r.Kill()
	if r.Running() {
		t.Fatalf("running after Kill")
	}
	short, cancel = context.WithTimeout(ctx, 500*time.Millisecond)
	err = c.Ping(short).Err()
	cancel()
	if err == nil {
		t.Fatalf("PING answered after Kill")
	}
	r.Restart()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after restart: %v", err)
	}
	if n, _ := c.Exists(ctx, "k").Result(); n != 0 {
		t.Errorf("key survived a restart without persistence")
	}
	r.Stop()
	r.Stop() // idempotent
}

func TestReplica(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := StartRedis(t)
	r := StartRedis(t, WithReplicaOf(p.Addr))
	info, err := r.Client().Info(ctx, "replication").Result()
	if err != nil || infoField(info, "role") != "slave" || infoField(info, "master_port") != strings.TrimPrefix(p.Addr, "127.0.0.1:") {
		t.Fatalf("replica INFO replication role=%q master_port=%q (%v)", infoField(info, "role"), infoField(info, "master_port"), err)
	}
}

func TestClusterSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := StartCluster(t)
	for i, n := range c.Nodes {
		mid := (c.Slots[i][0] + c.Slots[i][1]) / 2
		if got := c.NodeForSlot(mid); got != n {
			t.Errorf("NodeForSlot(%d) = %v, want node %d", mid, got, i)
		}
	}
	if err := c.Client().Set(ctx, "x", "1", 0).Err(); err != nil {
		t.Fatalf("SET through the cluster client: %v", err)
	}
}
