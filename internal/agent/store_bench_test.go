package agent_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/rules"
)

// BenchmarkDecideRedis measures a Redis-path decision as the agent makes
// it, without gRPC: Service.Decide over a RedisStore (automatic
// pipelining, as the gateway-agent opens it) against a real redis-server,
// 64 concurrent callers over 10,000 keys, like ration-bench's unary Allow
// row. Besides ns/op and allocs/op it reports the CPU of this process
// (agent work plus the benchmark's own loop) and of redis-server per
// decision, so a change can be judged on both sides of the round trip.
//
//	go test -run '^$' -bench DecideRedis -benchmem ./internal/agent/
//
// A CPU profile of the agent's store path: add -cpuprofile cpu.out.
func BenchmarkDecideRedis(b *testing.B) {
	benchDecideRedis(b, time.Second, func() (context.Context, func()) { return context.Background(), func() {} })
}

// BenchmarkCallerDeadlineDecide is BenchmarkDecideRedis for callers whose
// own deadline comes before the decision timeout would (a gRPC client's
// grpc-timeout, Envoy's rate-limit service timeout: 20ms by default against
// -decision-timeout's 50ms), the decision then bounded by the caller's
// context. Each caller goroutine has a context of its own (a gRPC server
// makes one per call: the allocations of the caller's context are not the
// agent's, and are left out here).
//
//	go test -run '^$' -bench CallerDeadlineDecide -benchmem ./internal/agent/
func BenchmarkCallerDeadlineDecide(b *testing.B) {
	benchDecideRedis(b, time.Hour, func() (context.Context, func()) {
		return context.WithTimeout(context.Background(), 10*time.Minute)
	})
}

// benchDecideRedis runs BenchmarkDecideRedis with a decision timeout and
// each caller goroutine's context from caller.
func benchDecideRedis(b *testing.B, timeout time.Duration, caller func() (context.Context, func())) {
	srv := harness.StartRedis(b)
	set, err := rules.Parse("bench.yaml", []byte(`
rules:
  - name: bench
    match: {user: "*"}
    burst: 1000000
    rate: 1000000
`))
	if err != nil {
		b.Fatal(err)
	}
	client, err := bucket.OpenRedis(srv.Addr, min(timeout, time.Second))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = client.Close() })
	svc, err := agent.New(agent.Options{
		Rules: agent.StaticRules{Set: set}, DecisionTimeout: timeout,
		Store: bucket.NewRedisStore(client, bucket.RedisOptions{Timeout: timeout}),
	})
	if err != nil {
		b.Fatal(err)
	}
	redisPID := redisProcessID(b, srv)
	const keys = 10_000
	descs := make([]map[string]string, keys)
	for i := range descs {
		descs[i] = map[string]string{"user": "k" + strconv.Itoa(i)}
	}
	var next atomic.Int64
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	self0, redis0 := processCPU(b, os.Getpid()), processCPU(b, redisPID)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx, done := caller()
		defer done()
		i := int(next.Add(1)) * 7919
		for pb.Next() {
			i++
			resp, err := svc.Decide(ctx, agent.Request{Descriptors: descs[i%keys]})
			if err != nil || resp.Reason != agent.ReasonOK {
				b.Errorf("decide: %+v, %v", resp, err)
				return
			}
		}
	})
	b.StopTimer()
	self1, redis1 := processCPU(b, os.Getpid()), processCPU(b, redisPID)
	n := float64(b.N)
	b.ReportMetric(n/b.Elapsed().Seconds(), "decisions/s")
	b.ReportMetric(float64((self1-self0).Microseconds())/n, "agent-cpu-µs/op")
	b.ReportMetric(float64((redis1-redis0).Microseconds())/n, "redis-cpu-µs/op")
}

// redisProcessID asks a server for its process id (INFO server).
func redisProcessID(b *testing.B, srv *harness.Redis) int {
	b.Helper()
	info, err := srv.Client().Info(context.Background(), "server").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			if pid, err := strconv.Atoi(v); err == nil {
				return pid
			}
		}
	}
	b.Fatalf("no process_id in INFO server")
	return 0
}

// processCPU is a process's user+system CPU time so far (/proc/PID/stat).
func processCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Skipf("no /proc: %v", err)
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: state is field 3, utime and stime are fields 14 and 15.
	rest := string(raw[strings.LastIndexByte(string(raw), ')')+2:])
	f := strings.Fields(rest)
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	return time.Duration(ut+st) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat times: 100 on every
// Linux platform Go supports.
const clockTicks = 100
