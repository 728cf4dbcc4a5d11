package agent_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/breaker"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/rules"
)

// A single rediss:// primary restarts, its scripts gone with it: while it
// is down the breaker opens and decisions get their policy; once it
// answers a probe the prober warms it (scripts loaded, connections made,
// TLS handshakes done) before the breaker closes. The first decision
// after that is decided by Redis without a NOSCRIPT and without opening a
// connection: the server accepts none while it is made.
func TestRestartedPrimaryWarmedBeforeBreakerCloses(t *testing.T) {
	pki := harness.NewPKI(t)
	r := harness.StartRedis(t, harness.WithTLS(pki.Issue("redis"), false))
	files := pki.Issue("agent")
	const timeout = time.Second // no decision to Redis may time out here
	client, err := bucket.OpenRedisTLS("rediss://"+r.TLSAddr, timeout, bucket.RedisTLS{CA: files.CA})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	store := bucket.NewRedisStore(client, bucket.RedisOptions{Timeout: timeout})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := store.Warm(ctx, bucket.WarmConns); err != nil {
		t.Fatal(err)
	}
	set, err := rules.Parse("warm.yaml", []byte(`
rules:
  - name: w
    match: {w: "*"}
    burst: 1000
    rate: 1000
    on_failure: fail_closed
`))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := agent.New(agent.Options{
		Rules: agent.StaticRules{Set: set}, Store: store, Logger: testLogger(t), Registry: prometheus.NewRegistry(),
		DecisionTimeout: timeout,
		Breaker:         breaker.Config{Threshold: 3, ProbeInterval: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	go svc.RunProber(ctx)
	decide := func() agent.Response {
		t.Helper()
		resp, err := svc.Decide(ctx, agent.Request{Rule: "w", Subject: "s"})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := decide(); resp.Reason != agent.ReasonOK {
		t.Fatalf("before the restart: %+v, want ok from Redis", resp)
	}
	r.Stop()
	waitFor(t, "the breaker open while the primary is down", func() bool {
		if resp := decide(); resp.Reason == agent.ReasonOK {
			t.Fatalf("decided by Redis while it is down: %+v", resp)
		}
		return svc.BreakerOpen()
	})
	r.Restart() // starts it again: no persistence, no scripts
	waitFor(t, "the breaker closed", func() bool { return !svc.BreakerOpen() })
	before := serverConns(t, r)
	if resp := decide(); resp.Reason != agent.ReasonOK || !resp.Allowed {
		t.Fatalf("first decision after the breaker closed: %+v, want allowed by Redis", resp)
	}
	if n := serverConns(t, r) - before; n != 0 {
		t.Errorf("the first decision after the restart opened %d connections, want 0 (made by the warm-up)", n)
	}
	if n := store.Rewarms(); n != 0 {
		t.Errorf("NOSCRIPT reloads = %d, want 0: the scripts are loaded before the breaker closes", n)
	}
}

// serverConns is r's count of client connections accepted (INFO stats
// total_connections_received), read over the harness's own connection,
// which the first read may have to make.
func serverConns(t *testing.T, r *harness.Redis) int {
	t.Helper()
	var n int
	for range 2 {
		info, err := r.Client().Info(context.Background(), "stats").Result()
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
