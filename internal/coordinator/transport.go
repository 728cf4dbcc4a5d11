package coordinator

import (
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// raftTransportConfig is the Raft transport's configuration (the caller
// sets Stream for TLS).
//
// Pipelined replication is off (MaxRPCsInFlight 1: every AppendEntries to
// a follower is synchronous). hashicorp/raft's pipeline deadlocks when a
// follower answers one append unsuccessfully (a log mismatch after a
// restart, a store error): its decoder stops reading answers, the next
// pipelined send waits for room forever, and the replication goroutine of
// that follower never returns. The follower still gets heartbeats (so it
// calls no election) and no entry again until the leader restarts, and
// the leader's Shutdown waits for that goroutine forever: a coordinator
// test's restart of a 3-node group hung 13 minutes in it. raft's own
// documentation of MaxRPCsInFlight reports the pipeline brings little
// outside very high-latency links; our entries batch commands already.
func raftTransportConfig(logger hclog.Logger) *raft.NetworkTransportConfig {
	return &raft.NetworkTransportConfig{
		MaxPool:         3,
		Timeout:         10 * time.Second,
		Logger:          logger,
		MaxRPCsInFlight: 1,
	}
}
