package holder

import (
	"testing"

	"github.com/ration-dev/ration/internal/coordinator"
)

// The holder keeps its own copies of the coordinator's per-item error texts
// (it depends on the wire contract, not on the coordinator's package); this
// keeps the copies from drifting.
func TestItemErrorsMatchCoordinator(t *testing.T) {
	for _, c := range []struct{ holder, coord string }{
		{itemErrLeaseExpired, coordinator.ItemErrLeaseExpired},
		{itemErrUnknownQuota, coordinator.ItemErrUnknownQuota},
		{itemErrRetryGrant, coordinator.ItemErrRetryGrant},
		{itemErrInvalid, coordinator.ItemErrInvalid},
	} {
		if c.holder != c.coord {
			t.Errorf("holder item error %q, coordinator sends %q", c.holder, c.coord)
		}
	}
}
