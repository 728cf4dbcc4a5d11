package bucket_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
)

// A TLS Cluster failover: master 1 is killed and its replica, whose
// scripts were flushed (SCRIPT LOAD is not replicated), is promoted. The
// new master is warmed before it decides: by the prober's topology read
// (WarmNew), after which the first decision on its slots opens no
// connection (the promoted server accepts none during it) and finds the
// scripts loaded (no NOSCRIPT); or, when a decision gets there first, by
// that decision, which waits for the warm-up and is then decided by
// Redis, scripts loaded, no NOSCRIPT either.
func TestClusterFailoverWarmsPromotedMaster(t *testing.T) {
	for _, proberFirst := range []bool{true, false} {
		t.Run("prober first "+strconv.FormatBool(proberFirst), func(t *testing.T) {
			cl, st := tlsClusterStore(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := st.Warm(ctx, bucket.WarmConns); err != nil {
				t.Fatalf("Warm: %v", err)
			}
			subject := cl.SubjectOn(t, 1, "u", func(s string) int { return bucket.KeySlot(bucket.Key("w", s)) })
			req := bucket.Request{Key: bucket.Key("w", subject), Limit: bucket.Limit{Burst: 100, Rate: 1}, Cost: 1}
			if _, err := st.Take(ctx, req); err != nil {
				t.Fatalf("take before the failover: %v", err)
			}
			promoted := cl.Replicas[1].Client()
			if err := promoted.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			old := cl.TLSAddrs[1]
			cl.Nodes[1].Kill()
			if _, err := cl.WaitPromoted(ctx, 1); err != nil {
				t.Fatal(err)
			}
			// As the agent's prober does: ping the dead master until the
			// topology (which go-redis reads again for it) has dropped it.
			for {
				err := st.PingNode(ctx, old)
				if errors.Is(err, bucket.ErrUnknownNode) {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("the dead master %s never left the topology: %v", old, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if got := st.NodeOf(ctx, req.Key); got != cl.Replicas[1].TLSAddr {
				t.Fatalf("NodeOf after the failover = %s, want the promoted %s", got, cl.Replicas[1].TLSAddr)
			}
			if proberFirst {
				if err := st.WarmNew(ctx); err != nil {
					t.Fatalf("WarmNew: %v", err)
				}
			}
			before := connsReceived(t, cl.Replicas[1])
			start := time.Now()
			if _, err := st.Take(ctx, req); err != nil {
				t.Fatalf("first take on the promoted master: %v; want decided by Redis", err)
			}
			// Reported, not asserted: what the first decision waited.
			t.Logf("first take on the promoted master: %v", time.Since(start))
			if proberFirst {
				if n := connsReceived(t, cl.Replicas[1]) - before; n != 0 {
					t.Errorf("the first decision on the warmed master opened %d connections, want 0 (handshakes done by the warm-up)", n)
				}
			}
			if n := st.Rewarms(); n != 0 {
				t.Errorf("NOSCRIPT reloads = %d, want 0: the scripts are loaded on the new master before it decides", n)
			}
			if n := st.Warmups(); n != 1 {
				t.Errorf("new masters warmed = %d, want 1", n)
			}
			exists, err := promoted.ScriptExists(ctx, bucket.ScriptSHAs()...).Result()
			if err != nil || !exists[0] || !exists[1] {
				t.Errorf("SCRIPT EXISTS on the promoted master = %v, %v; want both loaded", exists, err)
			}
		})
	}
}

// tlsClusterStore starts a TLS Cluster whose masters have a replica each
// and opens a store on it over rediss-cluster://, as the agent does.
func tlsClusterStore(t *testing.T) (*harness.Cluster, *bucket.RedisStore) {
	t.Helper()
	pki := harness.NewPKI(t)
	cl := harness.StartCluster(t, harness.WithTLS(pki.Issue("redis"), false), harness.WithClusterReplicas(),
		harness.WithConfig("cluster-require-full-coverage no"))
	files := pki.Issue("agent")
	const decision = time.Second // not what is tested: no decision may time out here
	c, err := bucket.OpenRedisTLS("rediss-cluster://"+strings.Join(cl.TLSAddrs, ","), decision, bucket.RedisTLS{CA: files.CA})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return cl, bucket.NewRedisStore(c, bucket.RedisOptions{Timeout: decision, WarmTimeout: 10 * time.Second})
}

// connsReceived is the server's count of client connections accepted
// (INFO stats total_connections_received), read over the harness's own
// connection, which the first read makes.
func connsReceived(t *testing.T, r *harness.Redis) int {
	t.Helper()
	ctx := context.Background()
	var n int
	for range 2 { // the first read may have to connect
		info, err := r.Client().Info(ctx, "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_connections_received:"); ok {
				n, _ = strconv.Atoi(v)
			}
		}
	}
	return n
}
