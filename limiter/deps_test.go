package limiter_test

import (
	"os/exec"
	"strings"
	"testing"
)

// What a Go gateway links by importing limiter: the agent's decision side
// (Redis client, gRPC client, Prometheus), never a coordinator's Raft and
// BoltDB nor the test tools of this module.
func TestLinksNoCoordinator(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go list needs the go command: %v", err)
	}
	out, err := exec.Command(gobin, "list", "-deps", "github.com/ration-dev/ration/limiter").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	pkgs := strings.Fields(string(out))
	if len(pkgs) < 10 {
		t.Fatalf("go list -deps listed %d packages: %q", len(pkgs), out)
	}
	for _, p := range pkgs {
		for _, banned := range []string{
			"github.com/ration-dev/ration/internal/coordinator", "github.com/ration-dev/ration/internal/harness",
			"github.com/hashicorp/raft", "go.etcd.io/bbolt", "github.com/boltdb/bolt",
			"github.com/Shopify/toxiproxy", "github.com/chromedp",
		} {
			if p == banned || strings.HasPrefix(p, banned+"/") {
				t.Errorf("limiter links %s (through %s)", banned, p)
			}
		}
	}
}
