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
	const timeout = time.Second
	client, err := bucket.OpenRedis(srv.Addr, timeout)
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
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	self0, redis0 := processCPU(b, os.Getpid()), processCPU(b, redisPID)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
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
