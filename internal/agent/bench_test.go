package agent_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/rules"
)

// BenchmarkDecide measures the agent's own work per decision (validation,
// matching, combining, metrics) on the in-memory store, so the store's
// round trip is not in the figure.
//
//	go test -run '^$' -bench Decide -benchmem ./internal/agent/
func BenchmarkDecide(b *testing.B) {
	set, err := rules.Parse("bench.yaml", []byte(`
rules:
  - name: per-user
    match: {user: "*"}
    burst: 1000000000
    rate: 1000000000
`))
	if err != nil {
		b.Fatal(err)
	}
	svc, err := agent.New(agent.Options{
		Rules: agent.StaticRules{Set: set}, Store: bucket.NewMemoryStore(nil), DecisionTimeout: time.Second,
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			reqs := make([]agent.Request, batch)
			for i := range reqs {
				reqs[i] = agent.Request{Descriptors: map[string]string{"user": fmt.Sprintf("u%d", i)}}
			}
			out := make([]agent.Response, batch)
			errs := make([]error, batch)
			b.ReportAllocs()
			for b.Loop() {
				svc.DecideBatch(ctx, reqs, out, errs)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/decision")
		})
	}
}
