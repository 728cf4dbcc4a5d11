package bucket_test

import (
	"bytes"
	"context"
	_ "embed"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
)

// scriptBefore is the bucket script as it was at 9abcb1c, before the Redis path's
// second round of cuts: BenchmarkScriptCost measures it beside today's in
// the same run, so that the comparison does not depend on the machine's load
// at two different times. It keeps a bucket as a hash (today's script as a
// string), so each script runs on keys of its own.
//
//go:embed testdata/redis-9abcb1c.lua
var scriptBefore string

// BenchmarkScriptCost measures what one script call costs inside
// redis-server, with the rows of docs/performance.md: redis-benchmark
// EVALSHA from one client unpipelined (`usec_per_call` of cmdstat_evalsha
// in INFO commandstats, and redis-server's CPU per call, network included,
// from /proc/PID/schedstat), and from 64 clients unpipelined (redis CPU per
// call: what the ceiling table's P1 row reports). Three scripts take turns in
// every round, in rotating order: today's, the one of 9abcb1c ("before") and
// a script that only returns 1 ("return1", the cost of the call itself),
// each with the arguments the agent sends for rule bench (burst and rate
// 10^6) over 10,000 keys. Each metric is the median over the rounds; one
// round is one b.N iteration, so run it with -benchtime Nx:
//
//	go test -run '^$' -bench ScriptCost -benchtime 7x ./internal/bucket/
func BenchmarkScriptCost(b *testing.B) {
	rb, err := exec.LookPath("redis-benchmark")
	if err != nil {
		b.Skip("redis-benchmark not found")
	}
	srv := harness.StartRedis(b)
	c := srv.Client()
	ctx := context.Background()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		b.Fatal(err)
	}
	pid := infoValue(info, "process_id")
	l := bucket.Limit{Burst: 1e6, Rate: 1e6}
	s := bucket.NewRedisStore(c, bucket.RedisOptions{})
	// The agent's own arguments for today's script; the script of 9abcb1c
	// took op, burst, rate, cost.
	argv := s.ScriptArgv(bucket.Request{Key: "k", Limit: l, Cost: 1})
	scripts := []struct {
		name, src string
		args      []string
	}{
		{"", bucket.ScriptSource, argv},
		{"-before", scriptBefore, []string{"take", "1e+06", "1e+06", "1"}},
		{"-return1", "return 1", argv},
	}
	// Each script its own keys: the script of 9abcb1c keeps a bucket as a
	// hash, today's as a string, and neither reads the other's form (today's
	// would rewrite a hash, a cost of its own).
	key := func(i int) string { return "ration:{bench" + scripts[i].name + "|user=k__rand_int__}" }
	shas := make([]string, len(scripts))
	for i, sc := range scripts {
		if shas[i], err = c.ScriptLoad(ctx, sc.src).Result(); err != nil {
			b.Fatal(err)
		}
	}
	// redis-benchmark runs one row; it returns requests/s.
	run := func(i int, clients, n int) float64 {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, rb, append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(srv.Port),
			"-c", strconv.Itoa(clients), "-n", strconv.Itoa(n), "-P", "1", "-r", "10000", "--csv",
			"EVALSHA", shas[i], "1", key(i)}, scripts[i].args...)...)
		var out bytes.Buffer
		cmd.Stdout = &out
		cmd.Stderr = &out
		if err := cmd.Run(); err != nil {
			b.Fatalf("redis-benchmark: %v\n%s", err, out.String())
		}
		// --csv: a header line, then "EVALSHA ...","rps",...
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		f := strings.Split(lines[len(lines)-1], ",")
		rps, err := strconv.ParseFloat(strings.Trim(f[1], `"`), 64)
		if err != nil {
			b.Fatalf("redis-benchmark output: %v\n%s", err, out.String())
		}
		return rps
	}
	type sample struct{ usec, cpu1, rps1, cpu64 float64 }
	samples := make([][]sample, len(scripts))
	const n1, n64 = 5000, 10000
	round := 0
	for b.Loop() {
		for k := range scripts {
			i := (k + round) % len(scripts)
			var sm sample
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			cpu := schedRunNs(pid)
			sm.rps1 = run(i, 1, n1)
			sm.cpu1 = float64(schedRunNs(pid)-cpu) / 1e3 / n1
			stats, err := c.Info(ctx, "commandstats").Result()
			if err != nil {
				b.Fatal(err)
			}
			sm.usec = usecPerCall(b, stats, "cmdstat_evalsha")
			cpu = schedRunNs(pid)
			run(i, 64, n64)
			sm.cpu64 = float64(schedRunNs(pid)-cpu) / 1e3 / n64
			samples[i] = append(samples[i], sm)
		}
		round++
	}
	for i, sc := range scripts {
		med := func(f func(sample) float64) float64 {
			v := make([]float64, len(samples[i]))
			for j, sm := range samples[i] {
				v[j] = f(sm)
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		b.ReportMetric(med(func(s sample) float64 { return s.usec }), "usec_per_call"+sc.name)
		b.ReportMetric(med(func(s sample) float64 { return s.cpu1 }), "cpu-µs/call-c1"+sc.name)
		b.ReportMetric(med(func(s sample) float64 { return s.cpu64 }), "cpu-µs/call-c64"+sc.name)
		b.ReportMetric(med(func(s sample) float64 { return s.rps1 }), "calls/s-c1"+sc.name)
	}
}

// schedRunNs is the time the process's main thread (where redis-server
// runs commands) has spent on a CPU, in ns; 0 where /proc has no schedstat.
func schedRunNs(pid string) int64 {
	data, err := os.ReadFile("/proc/" + pid + "/schedstat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseInt(f[0], 10, 64)
	return v
}

func infoValue(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// usecPerCall reads usec_per_call of one command from INFO commandstats.
func usecPerCall(b *testing.B, stats, cmd string) float64 {
	v := infoValue(stats, cmd)
	for _, kv := range strings.Split(v, ",") {
		if u, ok := strings.CutPrefix(kv, "usec_per_call="); ok {
			f, err := strconv.ParseFloat(u, 64)
			if err != nil {
				b.Fatal(err)
			}
			return f
		}
	}
	b.Fatalf("no usec_per_call in %q", v)
	return 0
}

// TestBenchScriptsPassAgentArgs: the redis-benchmark rows of
// scripts/bench.sh and scripts/bench-redis.sh run the bucket script with
// the arguments the agent itself would pass for their rules; a script or
// store change that moves those (the TTL the store passes, say) must move
// them too, or the ceiling measures another script call than the agent's.
func TestBenchScriptsPassAgentArgs(t *testing.T) {
	s := bucket.NewRedisStore(nil, bucket.RedisOptions{DisableAutoPipeline: true})
	for _, tt := range []struct {
		file  string
		limit bucket.Limit
	}{
		{"../../scripts/bench.sh", bucket.Limit{Burst: 1e6, Rate: 1e6}},
		{"../../scripts/bench-redis.sh", bucket.Limit{Burst: 1e9, Rate: 1e6}},
	} {
		src, err := os.ReadFile(tt.file)
		if err != nil {
			t.Fatal(err)
		}
		want := strings.Join(s.ScriptArgv(bucket.Request{Key: "k", Limit: tt.limit, Cost: 1}), " ")
		n := 0
		for line := range strings.SplitSeq(string(src), "\n") {
			_, args, ok := strings.Cut(line, "}' ")
			if !ok || !strings.HasPrefix(args, "take ") {
				continue
			}
			n++
			args, _, _ = strings.Cut(args, ")")
			args, _, _ = strings.Cut(args, `"`)
			args, _, _ = strings.Cut(args, " |")
			if args = strings.TrimSpace(args); args != want {
				t.Errorf("%s: EVALSHA ... %s; the agent passes %s for %+v", tt.file, args, want, tt.limit)
			}
		}
		if n == 0 {
			t.Errorf("%s: no EVALSHA ... take line found", tt.file)
		}
	}
}
