package harness

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Counter reads counter name from reg, summed over its label sets: 0 when
// reg has none (a counter vector with no child yet is not gathered).
func Counter(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	return 0
}

// Gauge reads gauge name from reg, summed over its label sets: 0 when reg
// has none.
func Gauge(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += m.GetGauge().GetValue()
			}
			return sum
		}
	}
	return 0
}
