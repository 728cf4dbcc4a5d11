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

// BenchmarkRenewScale is BenchmarkRenew's load (a 3-node loopback group,
// BoltDB with fsync, real gRPC, every holder renewing one lease in a
// closed loop) at issue 15's holder counts, with every holder holding the
// same quota (shared=true: each renewal is sized against all the others)
// or one quota each (scaleRules). Reported: renewals/s, p50 and p99 in ms. With n
// holders in a closed loop, p50 is about n / (renewals/s).
//
//	go test -run '^$' -bench RenewScale -benchtime 20000x ./internal/coordinator/
func BenchmarkRenewScale(b *testing.B) {
	for _, shared := range []bool{true, false} {
		for _, holders := range []int{1, 100, 1000, 10_000} {
			b.Run(fmt.Sprintf("shared=%v/holders=%d", shared, holders), func(b *testing.B) {
				benchRenewScale(b, holders, shared)
			})
		}
	}
}

// scaleRules: one rule whose quota is large enough for 10,000 holders,
// without floors (min_slice * holders above the rate would take the full
// water-filling, see docs/leases.md).
const scaleRules = `
rules:
  - name: per-tenant
    match: {tenant: "*"}
    burst: 1000000
    rate: 100000
    mode: leased
    lease: {period: 10s}
`

func benchRenewScale(b *testing.B, holders int, shared bool) {
	c := harness.StartCoordinators(b, 3, scaleRules)
	leader, _ := c.Leader(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	clients := make([]*coordinator.Client, min(holders, 8))
	for i := range clients {
		clients[i] = c.Client(coordinator.ClientOptions{})
	}
	hs := make([]*holder, holders)
	quotas := make([][]*rationv1.QuotaRef, holders)
	var setup sync.WaitGroup
	var setupErr atomic.Value
	for i := range hs {
		hs[i] = newHolder(fmt.Sprintf("agent-%d", i))
		subject := "shared"
		if !shared {
			subject = fmt.Sprintf("tenant-%d", i)
		}
		quotas[i] = []*rationv1.QuotaRef{{Rule: "per-tenant", Subject: subject}}
	}
	// Grants 64 at a time, so that 10,000 holders start in seconds.
	sem := make(chan struct{}, 64)
	for i := range hs {
		setup.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; setup.Done() }()
			req := hs[i].request(quotas[i], 1)
			resp, err := clients[i%len(clients)].Renew(ctx, req)
			if err == nil {
				err = hs[i].adopt(req, resp)
			}
			if err != nil {
				setupErr.CompareAndSwap(nil, err)
			}
		}()
	}
	setup.Wait()
	if err := setupErr.Load(); err != nil {
		b.Fatal(err)
	}
	req0, ent0 := batchStats(b, c.Registry(leader))
	lat := make([][]time.Duration, holders)
	var next, failed atomic.Int64
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
	b.ReportMetric(0, "ns/op")
}
