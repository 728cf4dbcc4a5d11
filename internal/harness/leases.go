package harness

import (
	"context"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
)

// DevLeases runs a lease holder against a real single-node coordinator
// (coordinator.StartDev, on a loopback port) with the rules of set, until
// the test ends. For benchmarks of the leased path: a quota's first
// decision waits up to 5s for its grant.
func DevLeases(t testing.TB, set *rules.Set) *holder.Leases {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	node, addr, err := coordinator.StartDev(ctx, nil, set)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	client := coordinator.NewClient([]string{addr}, coordinator.ClientOptions{})
	t.Cleanup(func() { client.Close() })
	h, err := holder.New(holder.Options{Client: client, Holder: "bench", ColdStart: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	go h.Run(ctx)
	return h
}
