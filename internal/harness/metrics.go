package harness

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Counter reads counter name from reg, summed over its label sets: 0 when
// reg has none (a counter vector with no child yet is not gathered).
func Counter(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return sum(t, reg, name, func(m *dto.Metric) float64 { return m.GetCounter().GetValue() })
}

// Gauge reads gauge name from reg, summed over its label sets: 0 when reg
// has none.
func Gauge(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return sum(t, reg, name, func(m *dto.Metric) float64 { return m.GetGauge().GetValue() })
}

func sum(t testing.TB, reg *prometheus.Registry, name string, value func(*dto.Metric) float64) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var total float64
			for _, m := range mf.GetMetric() {
				total += value(m)
			}
			return total
		}
	}
	return 0
}
