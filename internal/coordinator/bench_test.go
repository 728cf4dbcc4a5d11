package coordinator_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// BenchmarkRenew measures renewals committed per second by a 3-node
// loopback cluster (BoltDB with fsync, real gRPC), and the commit latency a
// holder sees, with many holders renewing concurrently through the
// batching path. One op is one Renew request of one lease (each holder has
// its own quota, so shares do not interact). Reported: renewals/s, p50 and
// p99 latency in ms, and requests per Raft entry on the leader.
//
//	go test -run '^$' -bench Renew -benchtime 3s ./internal/coordinator/
func BenchmarkRenew(b *testing.B) {
	for _, holders := range []int{1, 16, 128} {
		b.Run(fmt.Sprintf("holders=%d", holders), func(b *testing.B) {
			benchRenew(b, holders)
		})
	}
}

func benchRenew(b *testing.B, holders int) {
	c := harness.StartCoordinators(b, 3, testRules)
	leader, _ := c.Leader(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Agents each have their own connection; a few clients share the
	// load the way several agent processes would.
	clients := make([]*coordinator.Client, min(holders, 8))
	for i := range clients {
		clients[i] = c.Client(coordinator.ClientOptions{})
	}
	hs := make([]*holder, holders)
	quotas := make([][]*rationv1.QuotaRef, holders)
	for i := range hs {
		hs[i] = newHolder(fmt.Sprintf("agent-%d", i))
		quotas[i] = []*rationv1.QuotaRef{{Rule: "per-tenant", Subject: fmt.Sprintf("tenant-%d", i)}}
		req := hs[i].request(quotas[i], 1)
		resp, err := clients[i%len(clients)].Renew(ctx, req)
		if err == nil {
			err = hs[i].adopt(req, resp)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	req0, ent0 := batchStats(b, c.Registry(leader))
	lat := make([][]time.Duration, holders)
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for i := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := clients[i%len(clients)]
			for next.Add(1) <= int64(b.N) {
				req := hs[i].request(quotas[i], 1)
				t0 := time.Now()
				resp, err := cl.Renew(ctx, req)
				lat[i] = append(lat[i], time.Since(t0))
				if err == nil {
					err = hs[i].adopt(req, resp)
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d renewals failed, the first with: %v", n, firstErr.Load())
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	q := func(p float64) float64 {
		return float64(all[min(len(all)-1, int(p*float64(len(all))))]) / float64(time.Millisecond)
	}
	req1, ent1 := batchStats(b, c.Registry(leader))
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "renewals/s")
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	if ent1 > ent0 {
		b.ReportMetric((req1-req0)/(ent1-ent0), "requests/entry")
	}
	b.ReportMetric(0, "ns/op") // per-op time is meaningless with concurrent holders
}
