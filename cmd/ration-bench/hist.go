package main

import (
	"math"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Latencies are recorded in nanoseconds, from 1 ns to histMax, to three
// significant digits (every value within 0.1%); longer ones are clamped
// to histMax (a call cannot outlive -timeout by much anyway).
const histMax = int64(10 * time.Minute)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, histMax, 3) }

// clampNanos fits d into the histogram's range.
func clampNanos(d time.Duration) int64 { return min(max(int64(d), 1), histMax) }

// latencySummary is a histogram's percentiles in microseconds.
type latencySummary struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P95   float64 `json:"p95"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p99_9"`
	Max   float64 `json:"max"`
}

// summarize reads h's percentiles. maxNanos is the exact largest value
// recorded (the histogram's own is rounded up to its bucket).
func summarize(h *hdrhistogram.Histogram, maxNanos int64) latencySummary {
	if h.TotalCount() == 0 {
		return latencySummary{}
	}
	us := func(ns int64) float64 { return math.Round(float64(ns)/100) / 10 } // 0.1 µs
	q := func(p float64) float64 { return us(min(h.ValueAtPercentile(p), maxNanos)) }
	return latencySummary{
		Count: h.TotalCount(),
		Mean:  us(int64(h.Mean())),
		P50:   q(50),
		P90:   q(90),
		P95:   q(95),
		P99:   q(99),
		P999:  q(99.9),
		Max:   us(maxNanos),
	}
}
