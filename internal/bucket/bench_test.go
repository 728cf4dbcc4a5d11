package bucket_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
)

// Benchmarks: go test -run '^$' -bench . -benchmem ./internal/bucket/
// (scripts/bench-redis.sh runs them with redis-benchmark's ceiling for
// comparison). decisions/s is the throughput over the whole run.

func BenchmarkModelTake(b *testing.B) {
	l := bucket.Limit{Burst: 100, Rate: 1000}
	s, now := bucket.State{Tokens: 50, Last: t0}, t0
	var r bucket.Result
	for b.Loop() {
		now += 1500 // refills 1.5 tokens a take of 1: never runs dry
		s, r = bucket.Take(s, true, l, 1, now)
	}
	if !r.Allowed {
		b.Fatal("denied")
	}
}

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = bucket.Key("bench", strconv.Itoa(i))
	}
	return keys
}

// benchTake runs Take on s from parallel goroutines over keys, reporting
// decisions/s.
func benchTake(b *testing.B, s store, keys []string) {
	ctx := context.Background()
	l := bucket.Limit{Burst: 1e9, Rate: 1e6}
	var next atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(1)) * 7919
		for pb.Next() {
			i++
			if _, err := s.Take(ctx, bucket.Request{Key: keys[i%len(keys)], Limit: l, Cost: 1}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

func BenchmarkMemoryStoreTake(b *testing.B) {
	for _, n := range []int{1, 10_000} {
		b.Run("keys="+strconv.Itoa(n), func(b *testing.B) {
			benchTake(b, bucket.NewMemoryStore(nil), benchKeys(n))
		})
	}
}

// parallelism64 makes RunParallel use 64 goroutines.
func parallelism64() int { return max(1, 64/runtime.GOMAXPROCS(0)) }

func BenchmarkRedisStoreTake(b *testing.B) {
	srv := harness.StartRedis(b)
	keys := benchKeys(10_000)
	for _, mode := range []string{"autopipeline", "pooled"} {
		b.Run(mode, func(b *testing.B) {
			s := bucket.NewRedisStore(openRedis(b, srv.Addr, time.Second),
				bucket.RedisOptions{Timeout: time.Second, DisableAutoPipeline: mode == "pooled"})
			b.SetParallelism(parallelism64())
			benchTake(b, s, keys)
		})
	}
}

func BenchmarkRedisStoreTakeBatch(b *testing.B) {
	srv := harness.StartRedis(b)
	keys := benchKeys(10_000)
	ctx := context.Background()
	l := bucket.Limit{Burst: 1e9, Rate: 1e6}
	for _, size := range []int{100} {
		b.Run("size="+strconv.Itoa(size), func(b *testing.B) {
			s := bucket.NewRedisStore(openRedis(b, srv.Addr, time.Second), bucket.RedisOptions{Timeout: time.Second})
			reqs := make([]bucket.Request, size)
			out := make([]bucket.Outcome, size)
			i := 0
			for b.Loop() {
				for j := range reqs {
					i++
					reqs[j] = bucket.Request{Key: keys[i%len(keys)], Limit: l, Cost: 1}
				}
				s.TakeBatch(ctx, reqs, out)
				if out[0].Err != nil {
					b.Fatal(out[0].Err)
				}
			}
			b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}

func BenchmarkRedisStoreTakeSerial(b *testing.B) {
	srv := harness.StartRedis(b)
	keys := benchKeys(10_000)
	ctx := context.Background()
	l := bucket.Limit{Burst: 1e9, Rate: 1e6}
	for _, mode := range []string{"autopipeline", "pooled"} {
		b.Run(mode, func(b *testing.B) {
			s := bucket.NewRedisStore(openRedis(b, srv.Addr, time.Second),
				bucket.RedisOptions{Timeout: time.Second, DisableAutoPipeline: mode == "pooled"})
			i := 0
			for b.Loop() {
				i++
				if _, err := s.Take(ctx, bucket.Request{Key: keys[i%len(keys)], Limit: l, Cost: 1}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
