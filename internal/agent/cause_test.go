package agent_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/logformat"
)

// A failure policy taking over is logged with its rule, the dependency
// that failed and why, once for each rule: the production log's repeat
// limit (one line a minute per message) does not swallow the second
// rule's first line.
func TestFailurePolicyLogNamesRuleAndCause(t *testing.T) {
	c := harness.StartCoordinators(t, 1, rolloutRules)
	c.Shutdown(0)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(rolloutRules), 0o644); err != nil {
		t.Fatal(err)
	}
	var out harness.LogBuffer
	cfg := agent.DefaultConfig()
	cfg.RulesFile, cfg.Coordinators, cfg.AgentID, cfg.Insecure = path, strings.Join(c.GRPCAddrs(), ","), "a1", true
	cfg.HTTPAddr, cfg.GRPCAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.FirstGrantTimeout = 200 * time.Millisecond
	srv, err := agent.Start(context.Background(), cfg, logformat.New(&out, logformat.Text, slog.LevelInfo), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopAgent(srv) })
	for _, r := range []agent.Request{{Rule: "per-key", Subject: "k1"}, {Descriptors: map[string]string{"endpoint": "checkout"}}} {
		resp, err := srv.Service.Decide(context.Background(), r)
		if err != nil || resp.Reason != agent.ReasonUnavailable {
			t.Fatalf("decision %+v with the coordinators down = %+v, %v; want the failure policy's", r, resp, err)
		}
	}
	var lines []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, "failure policy activated") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("%d activation lines, want one for each rule:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for i, rule := range []string{"per-key", "hot-endpoint"} {
		l := lines[i]
		if !strings.Contains(l, "rule="+rule) || !strings.Contains(l, "dependency=coordinators") || !strings.Contains(l, "cause=") ||
			!strings.Contains(l, "unreachable") && !strings.Contains(l, "first grant") {
			t.Errorf("activation line %d = %s; want rule=%s, dependency=coordinators and a cause", i, l, rule)
		}
	}
}
