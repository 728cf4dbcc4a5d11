//go:build unix

package coordinator_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// BenchmarkLeasesOverTLS measures what mutual TLS on every coordinator
// link costs the renewal path: BenchmarkRenew's load (a 3-node loopback
// group, BoltDB with fsync; each holder renews one lease of its own quota
// per Renew, through a few shared clients) with the links in plaintext
// and with mutual TLS (harness.StartCoordinatorsTLS: the holders' gRPC
// calls and the Raft transport), the two side by side for each holder
// count so that one run compares them on the same machine load. Each
// holder's certificate names its agent id, as the coordinator requires;
// a client serving several holders presents one certificate naming all of
// them. Connections are made (and handshakes done) before the timer
// starts: this is the steady cost of encrypted links, not of handshakes.
//
// Reported: renewals/s, p50 and p99 latency in ms, requests per Raft
// entry, and the CPU time of the whole process (3 nodes and the clients)
// per renewal, which moves less than renewals/s when other work takes a
// varying share of the machine.
//
// Its name leaves out "Renew" so that make bench's -bench Renew does not
// run it too. scripts/bench-tls.sh runs it:
//
//	go test -run '^$' -bench LeasesOverTLS -benchtime 3s ./internal/coordinator/
func BenchmarkLeasesOverTLS(b *testing.B) {
	for _, holders := range []int{16, 128} {
		for _, link := range []string{"plaintext", "mtls"} {
			b.Run(fmt.Sprintf("holders=%d/link=%s", holders, link), func(b *testing.B) {
				benchRenewLinks(b, holders, link == "mtls")
			})
		}
	}
}

func benchRenewLinks(b *testing.B, holders int, mtls bool) {
	// Holders share clients the way several agent processes' holders
	// would share a few connections (as in BenchmarkRenew).
	clientOf := func(i int) int { return i % min(holders, 8) }
	var c *harness.Coordinators
	clients := make([]*coordinator.Client, min(holders, 8))
	if mtls {
		pki := harness.NewPKI(b)
		c = harness.StartCoordinatorsTLS(b, 3, testRules, pki)
		ids := make([][]string, len(clients))
		for i := range holders {
			k := clientOf(i)
			ids[k] = append(ids[k], tlsfiles.URI(tlsfiles.RoleAgent, benchHolderName(i)))
		}
		for k := range clients {
			files := pki.Issue(fmt.Sprintf("agents-%d", k), ids[k]...)
			clients[k] = c.Client(coordinator.ClientOptions{DialOptions: pki.DialOptions(files)})
		}
	} else {
		c = harness.StartCoordinators(b, 3, testRules)
		for k := range clients {
			clients[k] = c.Client(coordinator.ClientOptions{})
		}
	}
	leader, _ := c.Leader(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	hs := make([]*holder, holders)
	quotas := make([][]*rationv1.QuotaRef, holders)
	for i := range hs {
		hs[i] = newHolder(benchHolderName(i))
		quotas[i] = []*rationv1.QuotaRef{{Rule: "per-tenant", Subject: fmt.Sprintf("tenant-%d", i)}}
		req := hs[i].request(quotas[i], 1)
		resp, err := clients[clientOf(i)].Renew(ctx, req)
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
	cpu0 := processCPU(b)
	start := time.Now()
	for i := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := clients[clientOf(i)]
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
	cpu := processCPU(b) - cpu0
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
	b.ReportMetric(float64(cpu)/float64(time.Microsecond)/float64(b.N), "cpu-us/renewal")
	b.ReportMetric(0, "ns/op") // per-op time is meaningless with concurrent holders
}

// benchHolderName is holder i's agent id (and its certificate's).
func benchHolderName(i int) string { return fmt.Sprintf("agent-%d", i) }

// processCPU is the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
