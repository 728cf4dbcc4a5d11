package coordinator_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// batchStats reads ration_coordinator_batch_requests from a registry: the
// requests committed and the entries that carried them.
func batchStats(t testing.TB, reg *prometheus.Registry) (requests, entries float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "ration_coordinator_batch_requests" {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleSum(), float64(h.GetSampleCount())
		}
	}
	t.Fatal("ration_coordinator_batch_requests not registered")
	return 0, 0
}
