package coordinator

import (
	"fmt"

	gometrics "github.com/hashicorp/go-metrics/compat"
	gmprom "github.com/hashicorp/go-metrics/compat/prometheus"
	"github.com/prometheus/client_golang/prometheus"
)

// BridgeRaftMetrics sends hashicorp/raft's own instrumentation (commit and
// FSM apply timings, replication, snapshots, BoltDB) to reg, named
// ration_raft_* (Raft's names, e.g. ration_raft_commitTime).
//
// Raft emits them through go-metrics' process-wide sink, not per node, so
// this is a process-wide setting: main calls it once, in a process that runs
// one node. Processes running several nodes (tests) go without; every node
// still exports its own ration_coordinator_raft_* gauges from raft.Stats.
//
// Raft imports go-metrics' compat package, which forwards to
// armon/go-metrics unless built with -tags hashicorpmetrics; the compat
// prometheus sink follows the same tag, so the bridge works either way.
func BridgeRaftMetrics(reg prometheus.Registerer) error {
	sink, err := gmprom.NewPrometheusSinkFrom(gmprom.PrometheusOpts{
		Registerer: reg,
		Name:       "ration_raft_sink",
		Expiration: gmprom.DefaultPrometheusOpts.Expiration,
	})
	if err != nil {
		return fmt.Errorf("coordinator: raft metrics sink: %w", err)
	}
	cfg := gometrics.DefaultConfig("ration")
	cfg.EnableHostname = false
	cfg.EnableRuntimeMetrics = false // the Go collector covers them, named by convention
	if _, err := gometrics.NewGlobal(cfg, sink); err != nil {
		return fmt.Errorf("coordinator: raft metrics: %w", err)
	}
	return nil
}
