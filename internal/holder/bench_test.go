package holder_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
)

// BenchmarkLeasedTake measures a leased decision in process: no I/O, the
// clock read once per 1000 decisions as the agent does per batch. The
// lease comes from a real single-node coordinator; the quota is big enough
// never to run dry.
//
//	go test -run '^$' -bench LeasedTake -benchmem -cpu 1,2 ./internal/holder/
func BenchmarkLeasedTake(b *testing.B) {
	const yaml = `
rules:
  - name: hot
    match: {k: "*"}
    burst: 1000000000000
    rate: 1000000000000
    mode: leased
    lease: {period: 30s}
`
	set, err := rules.Parse("bench.yaml", []byte(yaml))
	if err != nil {
		b.Fatal(err)
	}
	r, _ := set.Rule("hot")
	ctx := context.Background()
	node, addr, err := coordinator.StartDev(ctx, nil, set)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { node.Close() })
	client := coordinator.NewClient([]string{addr}, coordinator.ClientOptions{})
	b.Cleanup(func() { client.Close() })
	h, err := holder.New(holder.Options{Client: client, Holder: "bench", ColdStart: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	b.Cleanup(cancel)
	go h.Run(rctx)

	for _, keys := range []int{1, 1000} {
		subjects := make([]string, keys)
		for i := range subjects {
			subjects[i] = fmt.Sprintf("s%d", i)
			if _, ok := h.Take(ctx, r, subjects[i], 1, h.Now()); !ok {
				b.Fatalf("no lease for %s", subjects[i])
			}
		}
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i, now := 0, h.Now()
				for pb.Next() {
					if i%1000 == 0 {
						now = h.Now()
					}
					if _, ok := h.Take(ctx, r, subjects[i%keys], 1, now); !ok {
						b.Error("lease lost during the benchmark")
						return
					}
					i++
				}
			})
		})
	}
}
