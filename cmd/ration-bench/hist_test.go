package main

import (
	"math"
	"testing"
	"time"
)

func TestSummarizePercentiles(t *testing.T) {
	h := newHist()
	var maxNs int64
	for i := 1; i <= 10000; i++ { // 1µs .. 10ms, uniform
		ns := clampNanos(time.Duration(i) * time.Microsecond)
		if err := h.RecordValue(ns); err != nil {
			t.Fatal(err)
		}
		maxNs = max(maxNs, ns)
	}
	s := summarize(h, maxNs)
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"p50", s.P50, 5000}, {"p90", s.P90, 9000}, {"p95", s.P95, 9500},
		{"p99", s.P99, 9900}, {"p99.9", s.P999, 9990}, {"mean", s.Mean, 5000.5},
	} {
		// Three significant digits: within 0.1% (plus rounding to 0.1 µs).
		if math.Abs(c.got-c.want) > c.want*0.001+0.1 {
			t.Errorf("%s = %v µs, want %v ± 0.1%%", c.name, c.got, c.want)
		}
	}
	if s.Max != 10000 || s.Count != 10000 {
		t.Errorf("max %v µs, count %d; want exactly 10000 and 10000", s.Max, s.Count)
	}
	if got := summarize(newHist(), 0); got != (latencySummary{}) {
		t.Errorf("empty histogram summarized as %+v, want zeros", got)
	}
}

func TestClampNanos(t *testing.T) {
	for _, c := range []struct {
		in   time.Duration
		want int64
	}{{0, 1}, {-5, 1}, {1500, 1500}, {time.Hour, histMax}} {
		if got := clampNanos(c.in); got != c.want {
			t.Errorf("clampNanos(%v) = %d, want %d", c.in, got, c.want)
		}
	}
}

// Shards merge into the same percentiles as one histogram, and a batch
// call counts once per call and once per decision (amortized).
func TestShardsMergeAndAmortize(t *testing.T) {
	shards := []*shard{newShard(true), newShard(true)}
	for i := range 1000 {
		tl := tally{}
		tl.add(kindAllowed, "ok", 90)
		tl.add(kindDenied, "over_limit", 9)
		tl.add(kindError, "invalid", 1)
		shards[i%2].add(time.Duration(i+1)*100*time.Microsecond, 100, tl)
	}
	tot := merge(shards)
	if tot.calls != 1000 || tot.decisions != 100000 {
		t.Fatalf("calls %d, decisions %d; want 1000 and 100000", tot.calls, tot.decisions)
	}
	if got := tot.counts[outcomeKey{kindAllowed, "ok"}] + tot.counts[outcomeKey{kindDenied, "over_limit"}] +
		tot.counts[outcomeKey{kindError, "invalid"}]; got != tot.decisions {
		t.Errorf("outcomes add up to %d, want %d", got, tot.decisions)
	}
	call := summarize(tot.lat, tot.maxLat)
	am := summarize(tot.amort, tot.maxAmort)
	if call.Count != 1000 || am.Count != 100000 {
		t.Errorf("per call count %d, per decision %d; want 1000 and 100000", call.Count, am.Count)
	}
	if math.Abs(call.P50-50000) > 50 || math.Abs(am.P50-500) > 0.6 {
		t.Errorf("p50 per call %v µs, amortized %v µs; want 50000 and 500", call.P50, am.P50)
	}
	if call.Max != 100000 || am.Max != 1000 {
		t.Errorf("max per call %v µs, amortized %v µs; want 100000 and 1000", call.Max, am.Max)
	}
}
