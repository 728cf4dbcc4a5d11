package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/limiter"
)

// The embedded limiter's cost per decision, against real parts started by
// internal/harness:
//
//	go test -run '^$' -bench . -benchmem -benchtime 2s ./limiter/
//
// BenchmarkAllowLeased is the in-process path: a mode: leased rule whose
// lease (from a real coordinator) is never spent, so every decision is
// one Allow against the local lease. BenchmarkAllowRedis is the Redis
// path, one pipelined round trip to a real redis-server, beside, on the
// same server in the same run, the agent's Redis store alone (the same
// script and client, no decision logic) and what a plain go-redis client
// pays for the cheapest round trips (PING, and EVALSHA of a script that
// returns 1).

const benchLeasedYAML = `
rules:
  - name: hot
    match: {endpoint: hot}
    burst: 1000000000
    rate: 1000000000
    mode: leased
    lease: {period: 2s}
`

// openLeased opens a limiter on benchLeasedYAML, its leases from a real
// one-node coordinator.
func openLeased(tb testing.TB, agentID string) *limiter.Limiter {
	tb.Helper()
	coords := harness.StartCoordinators(tb, 1, benchLeasedYAML)
	return open(tb, limiter.Config{
		RulesFile: writeRules(tb, benchLeasedYAML), Coordinators: coords.GRPCAddrs(), Insecure: true,
		AgentID: agentID, DecisionTimeout: time.Second,
	})
}

// leasedRequests are the two ways to name benchLeasedYAML's leased rule.
var leasedRequests = map[string]limiter.Request{
	"rule+subject": {Rule: "hot", Subject: "x"},
	"descriptors":  {Descriptors: map[string]string{"endpoint": "hot"}},
}

func BenchmarkAllowLeased(b *testing.B) {
	l := openLeased(b, "bench")
	ctx := context.Background()
	for name, req := range leasedRequests {
		b.Run(name, func(b *testing.B) {
			waitLeased(b, l, req)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := l.Allow(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("parallel", func(b *testing.B) {
		req := limiter.Request{Rule: "hot", Subject: "x"}
		waitLeased(b, l, req)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := l.Allow(ctx, req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// waitLeased waits until req is admitted on its lease (the first grant).
func waitLeased(b testing.TB, l *limiter.Limiter, req limiter.Request) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err := l.Allow(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		if d.Allowed && d.Reason == limiter.ReasonOK {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("no lease after 10s: %+v", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

const benchRedisYAML = `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 1000000000
    rate: 1000000000
`

func BenchmarkAllowRedis(b *testing.B) {
	redis := harness.StartRedis(b)
	l := open(b, limiter.Config{RulesFile: writeRules(b, benchRedisYAML), Redis: redis.Addr, DecisionTimeout: time.Second})
	ctx := context.Background()
	b.Run("limiter", func(b *testing.B) {
		req := limiter.Request{Rule: "per-user", Subject: "alice"}
		b.ReportAllocs()
		for b.Loop() {
			d, err := l.Allow(ctx, req)
			if err != nil || d.Reason != limiter.ReasonOK {
				b.Fatalf("%+v, %v: want admitted by Redis", d, err)
			}
		}
	})
	// The references. store-take: the agent's Redis store alone (the same
	// script, client options and pipeline as the limiter, without the
	// decision logic around it).
	b.Run("store-take", func(b *testing.B) {
		rc, err := bucket.OpenRedisTLS(redis.Addr, time.Second, bucket.RedisTLS{})
		if err != nil {
			b.Fatal(err)
		}
		defer rc.Close()
		st := bucket.NewRedisStore(rc, bucket.RedisOptions{Timeout: time.Second})
		req := bucket.Request{Key: bucket.Key("per-user", "bob"), Limit: bucket.Limit{Burst: 1e9, Rate: 1e9}, Cost: 1}
		b.ReportAllocs()
		for b.Loop() {
			if res, err := st.Take(ctx, req); err != nil || !res.Allowed {
				b.Fatalf("%+v, %v: want admitted", res, err)
			}
		}
	})
	// The harness's go-redis client, one round trip each.
	c := redis.Client()
	b.Run("go-redis-ping", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := c.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("go-redis-evalsha", func(b *testing.B) {
		sha, err := c.ScriptLoad(ctx, "return 1").Result()
		if err != nil {
			b.Fatal(err)
		}
		keys := []string{"ration:{bench}"}
		b.ReportAllocs()
		for b.Loop() {
			if err := c.EvalSha(ctx, sha, keys).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestLeasedDecisionAllocatesNothing: a decision on a held lease, by rule
// and subject or by descriptors, allocates nothing (what keeps it at the
// in-process cost BenchmarkAllowLeased measures). A change that moves the
// decision's stack buffers to the heap fails here, not only in a
// benchmark nobody reads.
func TestLeasedDecisionAllocatesNothing(t *testing.T) {
	l := openLeased(t, "allocs")
	ctx := context.Background()
	for name, req := range leasedRequests {
		waitLeased(t, l, req)
		// Averaged over 1000 calls and rounded down, so the background
		// renewals' few allocations do not count.
		if n := testing.AllocsPerRun(1000, func() {
			if d, err := l.Allow(ctx, req); err != nil || !d.Allowed {
				t.Fatalf("%s: %+v, %v", name, d, err)
			}
		}); n != 0 {
			t.Errorf("%s: %v allocations per leased decision, want 0", name, n)
		}
	}
}

// BenchmarkKeyAllowLeased is BenchmarkAllowLeased through a Key: the rule
// and subject checked once, the quota found once.
func BenchmarkKeyAllowLeased(b *testing.B) {
	l := openLeased(b, "bench")
	ctx := context.Background()
	req := limiter.Request{Rule: "hot", Subject: "x"}
	waitLeased(b, l, req)
	k, err := l.Key(req.Rule, req.Subject)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if d, err := k.Allow(ctx, 1); err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
		}
	})
	// The floor: the one monotonic clock read a leased decision makes
	// (Go's time.Since), on the same machine in the same run.
	b.Run("clock", func(b *testing.B) {
		start := time.Now()
		var sum time.Duration
		for b.Loop() {
			sum += time.Since(start)
		}
		if sum <= 0 {
			b.Fatal("the monotonic clock did not advance")
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := k.Allow(ctx, 1); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
