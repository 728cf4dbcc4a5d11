package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

const leasedOnlyRules = `
rules:
  - name: hot
    match: {hot: "*"}
    burst: 1000
    rate: 1000
    mode: leased
    lease: {period: 2s}
`

// leasedOnlyPlusRedis adds a mode: redis rule to leasedOnlyRules.
const leasedOnlyPlusRedis = leasedOnlyRules + `
  - name: per-user
    match: {user: "*"}
    burst: 5
    rate: 1
`

// An agent whose rules are all mode: leased runs without -redis against a
// real coordinator group: ready at once, deciding from its lease. A reload
// that adds a mode: redis rule is refused, by the watcher's poll and by
// SIGHUP's Reload alike, and the rules in force stay until the file holds
// rules the agent can run again.
func TestLeasedOnlyAgentWithoutRedis(t *testing.T) {
	c := harness.StartCoordinators(t, 1, leasedOnlyPlusRedis)
	a := startAgentOn(t, "", leasedOnlyRules, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
	})
	hot := &rationv1.AllowRequest{Descriptors: map[string]string{"hot": "x"}}
	user := &rationv1.AllowRequest{Descriptors: map[string]string{"user": "alice"}}
	if resp := a.allow(t, hot); !resp.Allowed || resp.Reason != rationv1.Reason_REASON_OK || resp.Limit != 1000 {
		t.Fatalf("leased rule without Redis = %v, want allowed from the lease (limit 1000)", resp)
	}
	if got := metricValue(t, a.srv.Registry, "ration_decisions_total",
		map[string]string{"rule": "hot", "path": "leased", "result": "allowed", "reason": "ok"}); got != 1 {
		t.Fatalf("leased decisions = %v, want 1", got)
	}

	if err := os.WriteFile(a.rules, []byte(leasedOnlyPlusRedis), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the watcher to refuse the new rules", func() bool {
		return metricValue(t, a.srv.Registry, "ration_rules_reloads_total", map[string]string{"result": "error"}) == 1
	})
	// Reload (SIGHUP) reports the refusal for as long as the file holds it,
	// though the content did not change since the poll saw it.
	for range 2 {
		err := a.srv.Reload()
		if err == nil || !strings.Contains(err.Error(), "-redis") || !strings.Contains(err.Error(), "per-user") {
			t.Fatalf("Reload(a mode: redis rule without -redis) = %v, want an error naming -redis and the rule", err)
		}
	}
	if resp := a.allow(t, user); resp.Reason != rationv1.Reason_REASON_NO_RULE {
		t.Fatalf("the refused rule decided %v, want no rule: the old rules stay", resp)
	}
	if resp := a.allow(t, hot); !resp.Allowed || resp.Limit != 1000 {
		t.Fatalf("the leased rule after a refused reload = %v, want it still serving", resp)
	}
	if got := metricValue(t, a.srv.Registry, "ration_rules_reloads_total", map[string]string{"result": "ok"}); got != 0 {
		t.Fatalf("ok reloads = %v, want 0", got)
	}

	// A leased-only change is taken again.
	if err := os.WriteFile(a.rules, []byte(strings.ReplaceAll(leasedOnlyRules, "burst: 1000", "burst: 500")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.srv.Reload(); err != nil {
		t.Fatalf("Reload(leased-only rules) = %v", err)
	}
	if resp := a.allow(t, hot); resp.Limit != 500 {
		t.Fatalf("after a leased-only reload = %v, want limit 500", resp)
	}
}

// Without -redis (and without -dev's in-memory store), a rules file with a
// mode: redis rule is refused at start, naming the rules; Check, which
// does not read the rules, lets it through.
func TestStartWithoutRedisNeedsLeasedRules(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(leasedOnlyPlusRedis), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.RulesFile = path
	cfg.Coordinators, cfg.Insecure = "127.0.0.1:1", true
	cfg.HTTPAddr, cfg.GRPCAddr = "127.0.0.1:0", "127.0.0.1:0"
	if err := cfg.Check(); err != nil {
		t.Fatalf("Check without -redis = %v: only the rules can tell", err)
	}
	srv, err := agent.Start(context.Background(), cfg, testLogger(t), nil)
	if err == nil {
		_ = srv.Shutdown(context.Background())
		t.Fatal("Start without -redis and with a mode: redis rule succeeded")
	}
	for _, want := range []string{"-redis", "[per-user]", "mode: leased"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start error %q does not say %q", err, want)
		}
	}
}
