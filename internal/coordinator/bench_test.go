package coordinator_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	benchRenewOn(b, testRules, holders, false, 1, benchSetup{})
}

// benchRenewOn runs renewLoop on a plaintext 3-node group with rulesYAML:
// holders holders of quotas of per-tenant (one each, or with shared the
// same one), their first leases granted parallel at a time, set up as
// setup says.
func benchRenewOn(b *testing.B, rulesYAML string, holders int, shared bool, parallel int, setup benchSetup) {
	c := harness.StartCoordinators(b, 3, rulesYAML, setup.group...)
	leader, _ := c.Leader(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Agents each have their own connection; a few clients share the
	// load the way several agent processes would.
	clients := make([]*coordinator.Client, min(holders, 8))
	for i := range clients {
		clients[i] = c.Client(setup.client)
	}
	quotas := benchQuotas(holders, shared)
	hs := startHolders(b, ctx, clients, quotas, parallel)
	renewLoop(b, ctx, c.Registry(leader), clients, hs, quotas, setup.cpu, setup.rate)
}

// benchSetup adjusts benchRenewOn: the nodes' configuration (group, as
// harness.StartCoordinators' opts), the clients' options, the CPU
// clock renewLoop reports CPU per renewal with (nil: none), and the
// renewals per second the holders offer together (0: a closed loop).
type benchSetup struct {
	group  []func(*coordinator.Config)
	client coordinator.ClientOptions
	cpu    func(*testing.B) time.Duration
	rate   float64
}

// benchHolderName is holder i's agent id (and its certificate's).
func benchHolderName(i int) string { return fmt.Sprintf("agent-%d", i) }

// benchQuotas is the quota each of n holders renews: one of the
// per-tenant rule's quotas each, or with shared the same one for all.
func benchQuotas(n int, shared bool) [][]*rationv1.QuotaRef {
	quotas := make([][]*rationv1.QuotaRef, n)
	for i := range quotas {
		subject := "shared"
		if !shared {
			subject = fmt.Sprintf("tenant-%d", i)
		}
		quotas[i] = []*rationv1.QuotaRef{{Rule: "per-tenant", Subject: subject}}
	}
	return quotas
}

// startHolders makes a holder (named benchHolderName(i)) for each of
// quotas and gives holder i its first lease of quotas[i] through
// clients[i%len(clients)], parallel grants at a time.
func startHolders(b testing.TB, ctx context.Context, clients []*coordinator.Client, quotas [][]*rationv1.QuotaRef, parallel int) []*holder {
	hs := make([]*holder, len(quotas))
	for i := range hs {
		hs[i] = newHolder(benchHolderName(i))
	}
	var wg sync.WaitGroup
	var firstErr atomic.Value
	sem := make(chan struct{}, parallel)
	for i := range hs {
		sem <- struct{}{}
		if firstErr.Load() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			req := hs[i].request(quotas[i], 1)
			resp, err := clients[i%len(clients)].Renew(ctx, req)
			if err == nil {
				err = hs[i].adopt(req, resp)
			}
			if err != nil {
				firstErr.CompareAndSwap(nil, err)
			}
		}()
	}
	wg.Wait()
	if err := firstErr.Load(); err != nil {
		b.Fatal(err)
	}
	return hs
}

// renewLoop is the timed part of the renewal benchmarks: every holder
// hs[i] renews its lease of quotas[i] (see startHolders) through
// clients[i%len(clients)], one goroutine each, until they have made b.N
// renewals in all. With rate 0 each holder renews again as soon as it has
// its answer (a closed loop: the group's saturation, where a renewal's wait
// is about len(hs) / (renewals/s) by Little's law). With rate > 0 the
// holders offer rate renewals/s together (an open loop, the way holders
// renew at their renew points): holder i's renewals are due every
// len(hs)/rate seconds, the holders' due times spread evenly over that
// interval, and a renewal's latency counts from its due time, so a group
// that falls behind shows it as latency rather than as fewer requests
// (coordinated omission). It reports renewals/s, p50 and p99 latency in
// ms, requests per Raft entry on the leader whose registry reg is, and,
// given cpu (the CPU time the process has used), the CPU time per renewal.
func renewLoop(b *testing.B, ctx context.Context, reg *prometheus.Registry, clients []*coordinator.Client, hs []*holder, quotas [][]*rationv1.QuotaRef, cpu func(*testing.B) time.Duration, rate float64) {
	req0, ent0 := batchStats(b, reg)
	lat := make([][]time.Duration, len(hs))
	var next, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	var interval time.Duration
	if rate > 0 {
		interval = time.Duration(float64(len(hs)) / rate * float64(time.Second))
	}
	b.ResetTimer()
	var cpu0, cpuUsed time.Duration
	if cpu != nil {
		cpu0 = cpu(b)
	}
	start := time.Now()
	for i := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := clients[i%len(clients)]
			due := start.Add(interval * time.Duration(i) / time.Duration(len(hs)))
			for next.Add(1) <= int64(b.N) {
				req := hs[i].request(quotas[i], 1)
				t0 := time.Now()
				if interval > 0 {
					if wait := time.Until(due); wait > 0 {
						time.Sleep(wait)
					}
					t0 = due
					due = due.Add(interval)
				}
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
	if cpu != nil {
		cpuUsed = cpu(b) - cpu0
	}
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d renewals failed, the first with: %v", n, firstErr.Load())
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	q := func(p float64) float64 {
		return float64(all[min(len(all)-1, int(p*float64(len(all))))]) / float64(time.Millisecond)
	}
	req1, ent1 := batchStats(b, reg)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "renewals/s")
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	if ent1 > ent0 {
		b.ReportMetric((req1-req0)/(ent1-ent0), "requests/entry")
	}
	if cpu != nil {
		b.ReportMetric(float64(cpuUsed)/float64(time.Microsecond)/float64(b.N), "cpu-us/renewal")
	}
	b.ReportMetric(0, "ns/op") // per-op time is meaningless with concurrent holders
}
