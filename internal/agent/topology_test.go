package agent_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Sentinel: after the primary is killed and the replica promoted, the agent
// decides against the new primary without a restart.
func TestSentinelFailover(t *testing.T) {
	s := harness.StartSentinel(t, "ration-test")
	url := "redis-sentinel://" + strings.Join(s.SentinelAddrs, ",") + "/" + s.MasterName
	a := startAgentOn(t, url, oneRule)

	if resp := a.allow(t, &rationv1.AllowRequest{Rule: "hot", Subject: "before"}); !resp.Allowed || resp.Reason != rationv1.Reason_REASON_OK {
		t.Fatalf("before failover = %v, want ok from the primary", resp)
	}
	s.Primary.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	newAddr, err := s.WaitForFailover(ctx)
	if err != nil {
		t.Fatalf("failover: %v", err)
	}
	if newAddr != s.Replica.Addr {
		t.Fatalf("new primary %s, want the replica %s", newAddr, s.Replica.Addr)
	}
	// Decisions during the failover go through the policy (fail_closed);
	// once the client has followed the Sentinels they come from Redis again.
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp := a.allow(t, &rationv1.AllowRequest{Rule: "hot", Subject: "after"})
		if resp.Reason == rationv1.Reason_REASON_OK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent never decided against the new primary; last answer %v", resp)
		}
		time.Sleep(100 * time.Millisecond)
	}
	n, err := s.Replica.Client().Exists(context.Background(), bucket.Key("hot", "after")).Result()
	if err != nil || n != 1 {
		t.Fatalf("new primary holds the bucket: exists=%d err=%v, want 1", n, err)
	}
}

// Cluster: buckets whose keys hash to each of the three masters decide
// correctly (burst enforced on every node).
func TestClusterAllMasters(t *testing.T) {
	c := harness.StartCluster(t)
	a := startAgentOn(t, "redis-cluster://"+strings.Join(c.Addrs, ","), `
rules:
  - name: c
    match: {user: "*"}
    burst: 3
    rate: 0
`)
	ctx := context.Background()
	covered := map[int]string{} // node index -> subject
	for i := 0; len(covered) < len(c.Nodes) && i < 1000; i++ {
		subject := fmt.Sprintf("user=u%d", i)
		slot, err := c.Client().ClusterKeySlot(ctx, bucket.Key("c", subject)).Result()
		if err != nil {
			t.Fatal(err)
		}
		for n, r := range c.Slots {
			if int(slot) >= r[0] && int(slot) <= r[1] {
				if _, ok := covered[n]; !ok {
					covered[n] = fmt.Sprintf("u%d", i)
				}
			}
		}
	}
	if len(covered) != len(c.Nodes) {
		t.Fatalf("found subjects for %d of %d masters", len(covered), len(c.Nodes))
	}
	for n, user := range covered {
		var allowed int
		for i := 0; i < 5; i++ {
			if a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"user": user}}).Allowed {
				allowed++
			}
		}
		if allowed != 3 {
			t.Errorf("master %d (user %s): admitted %d of 5, want the burst 3", n, user, allowed)
		}
		key := bucket.Key("c", "user="+user)
		if got, err := c.Nodes[n].Client().Exists(ctx, key).Result(); err != nil || got != 1 {
			t.Errorf("master %d does not hold %s (exists=%d, err=%v)", n, key, got, err)
		}
	}
}
