package agent_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
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

// BenchmarkDecideLeased measures the agent's work per leased decision: a
// mode: leased rule whose lease, from a real single-node coordinator, is
// big enough never to run dry, decided by Decide one request at a time (as
// the embedded limiter's Allow does), so every figure is the Service's
// work plus the holder's spend, no I/O.
//
//	go test -run '^$' -bench DecideLeased -benchmem ./internal/agent/
func BenchmarkDecideLeased(b *testing.B) {
	const yaml = `
rules:
  - name: hot
    match: {endpoint: hot}
    burst: 1000000000000
    rate: 1000000000000
    mode: leased
    lease: {period: 30s}
`
	set, err := rules.Parse("bench.yaml", []byte(yaml))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	h := harness.DevLeases(b, set)
	svc, err := agent.New(agent.Options{
		Rules: agent.StaticRules{Set: set}, Store: bucket.NewMemoryStore(nil), Leases: h, DecisionTimeout: 5 * time.Second,
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		req  agent.Request
	}{
		{"rule+subject", agent.Request{Rule: "hot", Subject: "x"}},
		{"descriptors", agent.Request{Descriptors: map[string]string{"endpoint": "hot"}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			// The first decision waits for the grant.
			if resp, err := svc.Decide(ctx, bc.req); err != nil || resp.Reason != agent.ReasonOK {
				b.Fatalf("first decision = %+v, %v: want admitted on the lease", resp, err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if resp, err := svc.Decide(ctx, bc.req); err != nil || resp.Reason != agent.ReasonOK {
					b.Fatalf("%+v, %v: want admitted on the lease", resp, err)
				}
			}
		})
	}
}
