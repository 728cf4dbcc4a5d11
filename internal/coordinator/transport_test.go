package coordinator_test

import (
	"testing"

	"github.com/ration-dev/ration/internal/harness"
)

// Replication to followers is synchronous, plaintext and under TLS:
// hashicorp/raft's pipelined replication deadlocks after a follower's
// unsuccessful append (transport.go), which hung a group's restart for
// 13 minutes and would leave a follower without entries for good.
func TestRaftReplicationIsNotPipelined(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) *harness.Coordinators
	}{
		{"plaintext", func(t *testing.T) *harness.Coordinators { return harness.StartCoordinators(t, 2, testRules) }},
		{"tls", func(t *testing.T) *harness.Coordinators {
			return harness.StartCoordinatorsTLS(t, 2, testRules, harness.NewPKI(t))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.start(t)
			a, b := c.Node(0), c.Node(1)
			if a.PipelinesReplication(b.ID(), b.RaftAddr()) {
				t.Fatalf("node %s pipelines AppendEntries to %s: MaxRPCsInFlight must be 1", a.ID(), b.ID())
			}
		})
	}
}
