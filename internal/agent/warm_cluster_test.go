package agent_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/breaker"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// A TLS Cluster failover under traffic, through the agent's gRPC API:
// master 1 is killed while decisions on its slots keep coming, and its
// replica, whose scripts were flushed (SCRIPT LOAD is not replicated), is
// promoted. The agent's prober, whose reads of the topology bring the new
// master in, warms it (scripts loaded, connections open, TLS handshakes
// done) before its first decision: the warm-up is counted as the prober's
// (topology_read) and none as a decision's (first_decision), no decision
// found the scripts gone (noscript), and once Redis decides the slots
// again no decision falls to the failure policy nor opens a connection to
// the new master.
func TestClusterFailoverUnderTrafficWarmedByProber(t *testing.T) {
	pki := harness.NewPKI(t)
	cl := harness.StartCluster(t, harness.WithTLS(pki.Issue("redis"), false), harness.WithClusterReplicas(),
		harness.WithConfig("cluster-require-full-coverage no"))
	files := pki.Issue("agent")
	a := startAgentOn(t, "rediss-cluster://"+strings.Join(cl.TLSAddrs, ","), `
rules:
  - name: c
    match: {c: "*"}
    burst: 100000
    rate: 1000
    on_failure: fail_closed
`, func(cfg *agent.Config) {
		cfg.RedisTLS = bucket.RedisTLS{CA: files.CA}
		cfg.Breaker = breaker.Config{Threshold: 3, ProbeInterval: 100 * time.Millisecond}
	})
	// The rule's subject of descriptors {c: v} is "c=v".
	dead := cl.SubjectOn(t, 1, "u", func(v string) int { return bucket.KeySlot(bucket.Key("c", "c="+v)) })
	req := &rationv1.AllowRequest{Descriptors: map[string]string{"c": dead}}
	if resp := a.allow(t, req); resp.Reason != rationv1.Reason_REASON_OK {
		t.Fatalf("before the kill: %v, want ok from Redis", resp)
	}
	promoted := cl.Replicas[1]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := promoted.Client().ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	cl.Nodes[1].Kill()
	done := make(chan error, 1)
	go func() {
		_, err := cl.WaitPromoted(ctx, 1)
		done <- err
	}()
	// Decisions keep coming while the master is down and its replica is
	// promoted: each answered by the policy (the breaker open) until Redis
	// decides again. Bounded by ctx (60s) and by count.
	const most = 20000
	byPolicy, firstOK := 0, -1
	for i := 0; i < most && firstOK < 0; i++ {
		resp := a.allow(t, req)
		switch {
		case resp.Reason == rationv1.Reason_REASON_OK:
			firstOK = i
		case resp.Allowed:
			t.Fatalf("decision %d: %v, want fail_closed's denial or Redis's answer", i, resp)
		default:
			byPolicy++
		}
		if ctx.Err() != nil {
			t.Fatalf("no decision by Redis within 60s of the kill (%d by the policy)", byPolicy)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if firstOK < 0 {
		t.Fatalf("no decision by Redis in %d decisions", most)
	}
	// Redis decided again: the replica was promoted (the harness may see
	// it later than the agent did).
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d decisions by the policy before Redis decided the slots again", byPolicy)
	// Once Redis decides the slots, it decides each of them: the new
	// master is warm, and no decision times out on it nor opens a
	// connection to it.
	before := serverConns(t, promoted)
	for i := range 50 {
		if resp := a.allow(t, req); resp.Reason != rationv1.Reason_REASON_OK || !resp.Allowed {
			t.Fatalf("decision %d after Redis decided again: %v, want allowed by Redis", i, resp)
		}
	}
	if n := serverConns(t, promoted) - before; n != 0 {
		t.Errorf("50 decisions on the promoted master opened %d connections to it, want 0", n)
	}
	for cause, want := range map[string]int{"topology_read": 1, "first_decision": 0, "noscript": 0} {
		if !metricText(t, a.srv, `ration_store_warmups_total{cause="`+cause+`"} `+strconv.Itoa(want)+"\n") {
			t.Errorf("ration_store_warmups_total{cause=%q} != %d: the promoted master is to be warmed by the prober before any decision reaches it", cause, want)
		}
	}
	exists, err := promoted.Client().ScriptExists(ctx, bucket.ScriptSHAs()...).Result()
	if err != nil || !exists[0] || !exists[1] {
		t.Errorf("SCRIPT EXISTS on the promoted master = %v, %v; want both loaded", exists, err)
	}
}
