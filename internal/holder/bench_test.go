package holder_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
)

// benchLeasedRules is a leased rule whose lease never runs dry in a
// benchmark.
const benchLeasedRules = `
rules:
  - name: hot
    match: {k: "*"}
    burst: 1000000000000
    rate: 1000000000000
    mode: leased
    lease: {period: 30s}
`

// BenchmarkLeasedTake measures a leased decision in process: no I/O, the
// clock read once per 1000 decisions as the agent does per batch. The
// lease comes from a real single-node coordinator; the quota is big enough
// never to run dry.
//
//	go test -run '^$' -bench LeasedTake -benchmem -cpu 1,2 ./internal/holder/
func BenchmarkLeasedTake(b *testing.B) {
	h, r := benchHolder(b, benchLeasedRules)
	for _, keys := range []int{1, 1000} {
		subjects := knownSubjects(b, h, r, "s", keys)
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			parallelTakes(b, h, r, func(i int) string { return subjects[i%keys] })
		})
	}
}

// BenchmarkSharedTake measures a decision of a rule with
// lease.default_share: spent from the subject's copy of the agent's
// default lease, for 1000 subjects seen before and for a new subject at
// every decision (its copy made then; the subject name is formatted in
// the loop, as a request's would be parsed).
//
//	go test -run '^$' -bench SharedTake -benchmem -cpu 1,2 ./internal/holder/
func BenchmarkSharedTake(b *testing.B) {
	const yaml = `
rules:
  - name: hot
    match: {k: "*"}
    burst: 1000000000000
    rate: 1000000000000
    mode: leased
    lease: {period: 30s, default_share: 0.5}
`
	h, r := benchHolder(b, yaml)
	const keys = 1000
	subjects := knownSubjects(b, h, r, "k=s", keys)
	b.Run("keys=1000", func(b *testing.B) {
		parallelTakes(b, h, r, func(i int) string { return subjects[i%keys] })
	})
	var next atomic.Int64
	b.Run("new subject each", func(b *testing.B) {
		parallelTakes(b, h, r, func(int) string { return fmt.Sprintf("k=n%d", next.Add(1)) })
	})
}

// knownSubjects makes n subjects prefix0, prefix1, ... and decides each
// once, so that the benchmark finds their leases (or copies) in place.
func knownSubjects(b *testing.B, h *holder.Leases, r *rules.Rule, prefix string, n int) []string {
	b.Helper()
	subjects := make([]string, n)
	for i := range subjects {
		subjects[i] = fmt.Sprintf("%s%d", prefix, i)
		if _, ok := h.Take(context.Background(), r, subjects[i], 1, h.Now()); !ok {
			b.Fatalf("no lease for %s", subjects[i])
		}
	}
	return subjects
}

// parallelTakes decides one token per iteration on every core, for the
// subject subject(i) at the i-th iteration of each goroutine, reading the
// clock once per 1000 decisions as the agent does per batch.
func parallelTakes(b *testing.B, h *holder.Leases, r *rules.Rule, subject func(i int) string) {
	b.ReportAllocs()
	ctx := context.Background()
	b.RunParallel(func(pb *testing.PB) {
		i, now := 0, h.Now()
		for pb.Next() {
			if i%1000 == 0 {
				now = h.Now()
			}
			if _, ok := h.Take(ctx, r, subject(i), 1, now); !ok {
				b.Error("lease lost during the benchmark")
				return
			}
			i++
		}
	})
}

// benchHolder runs a holder against a real single-node coordinator with
// the rules in yaml until the benchmark ends, and returns it with the rule
// "hot".
func benchHolder(b *testing.B, yaml string) (*holder.Leases, *rules.Rule) {
	b.Helper()
	set, err := rules.Parse("bench.yaml", []byte(yaml))
	if err != nil {
		b.Fatal(err)
	}
	r, _ := set.Rule("hot")
	return harness.DevLeases(b, set), r
}

// BenchmarkRefSpend is a leased decision through a Ref (the quota found
// once, the clock read at every decision), beside the clock read alone.
//
//	go test -run '^$' -bench RefSpend -benchmem ./internal/holder/
func BenchmarkRefSpend(b *testing.B) {
	h, r := benchHolder(b, benchLeasedRules)
	knownSubjects(b, h, r, "s", 1)
	ref := h.Ref(r, "s0")
	b.Run("spend", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if allowed, _, _, _, ok := ref.Spend(1); !ok || !allowed {
				b.Fatal("lease lost during the benchmark")
			}
		}
	})
	b.Run("clock", func(b *testing.B) {
		var sum int64
		for b.Loop() {
			sum += h.Now()
		}
		if sum < 0 {
			b.Fatal("clock went backwards")
		}
	})
}
