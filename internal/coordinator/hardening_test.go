package coordinator_test

import (
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
)

// Connections to the coordinator's -http listener that send their header
// one byte a second are closed after its header timeout (http.go's
// ReadHeaderTimeout, 5s; its ReadTimeout, 10s, would close them too, but
// later), and /healthz is answered meanwhile.
func TestSlowLorisCoordinatorHTTP(t *testing.T) {
	c := harness.StartCoordinators(t, 1, testRules, func(cfg *coordinator.Config) { cfg.HTTPAddr = "127.0.0.1:0" })
	harness.CheckSlowLoris(t, 5*time.Second, 8, c.Node(0).HTTPAddr())
}
