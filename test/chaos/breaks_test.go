package chaos

import (
	"testing"
)

// splitBrain is the break of the leased scenarios whose protection the
// suite cannot remove from outside the code (S1, S1 pause, S2, S4, S6,
// S13, S17): under RATION_CHAOS_BREAK=<scenario>, agent i > 0 leases from a
// coordinator group of its own, so the agents spend the quota twice
// under the scenario's fault. It shows that the scenario's judges catch
// an overshoot there, not that each of its protections is needed.
func splitBrain(t testing.TB, scenario string, i int, rulesYAML, coordAddrs string) string {
	t.Helper()
	if !broken(scenario) || i == 0 {
		return coordAddrs
	}
	t.Logf("chaos: %s protection removed: agent %d leases from a coordinator group of its own", scenario, i)
	return joinAddrs(startCoordinators(t, 1, rulesYAML).GRPCAddrs())
}
