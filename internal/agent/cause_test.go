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

// A Redis that refuses connections is reported as refusing them, at once:
// the decision does not wait its timeout out in dial retries (go-redis's
// default waits 100ms between five dials, longer than a decision's whole
// default timeout), and the failure the breaker counts and the log names
// is the refusal, not "deadline exceeded". The timeout here is a
// generous 2s, which the default dial retries (4 pauses of 100ms for each
// of go-redis's 4 command attempts) outlast.
func TestRefusedStoreIsTheCause(t *testing.T) {
	r := harness.StartRedis(t)
	var out harness.LogBuffer
	a := startAgentLogging(t, r.Addr, oneRule, nil, logformat.New(&out, logformat.Text, slog.LevelInfo), func(cfg *agent.Config) {
		cfg.DecisionTimeout = 2 * time.Second
	})
	waitFor(t, "agent ready", a.srv.Ready)
	req := agent.Request{Descriptors: map[string]string{"user": "bob"}}
	if resp, err := a.srv.Service.Decide(context.Background(), req); err != nil || resp.Reason != agent.ReasonOK {
		t.Fatalf("decision on a live Redis = %+v, %v", resp, err)
	}
	r.Kill()
	resp, err := a.srv.Service.Decide(context.Background(), req)
	if err != nil || resp.Reason != agent.ReasonUnavailable {
		t.Fatalf("decision on a dead Redis = %+v, %v; want the failure policy's", resp, err)
	}
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, "failure policy activated") {
			if !strings.Contains(l, "connection refused") {
				t.Errorf("activation line names %q; want the refused connection as its cause", l)
			}
			return
		}
	}
	t.Fatalf("no activation line logged:\n%s", out.String())
}
