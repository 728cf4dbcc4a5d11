//go:build unix

package coordinator_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
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
	quotas := benchQuotas(holders, false)
	hs := startHolders(b, ctx, clients, quotas, 1)
	renewLoop(b, ctx, c.Registry(leader), clients, hs, quotas, processCPU, 0)
}

// processCPU is the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
