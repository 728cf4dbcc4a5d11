package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
)

// An agent whose -redis credentials a real redis-server refuses says so:
// at start (an error naming authentication, not only "could not read
// maxmemory-policy"), and in the log line of the failure episode that the
// first decision starts (not a bare "store unreachable").
func TestRedisAuthFailureSaid(t *testing.T) {
	r := harness.StartRedis(t, harness.WithPassword("the-right-one"))
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte("rules:\n  - name: a\n    match: {k: v}\n    burst: 10\n    rate: 1\n    on_failure: fail_open\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, spec, reply string
	}{
		{"wrong password", "redis://:not-it@" + r.Addr, "WRONGPASS"},
		{"no password", "redis://" + r.Addr, "NOAUTH"},
		{"unknown ACL user", "redis://nobody:the-right-one@" + r.Addr, "WRONGPASS"},
	} {
		t.Run(c.name, func(t *testing.T) {
			logs := runAgentOnce(t, rulesFile, c.spec)
			var start, episode bool
			for _, l := range logs {
				msg, _ := l["msg"].(string)
				errText, _ := l["err"].(string)
				if !strings.Contains(msg, "authentication failed") {
					continue
				}
				if !strings.Contains(errText, c.reply) {
					t.Errorf("%q: err %q, want Redis's %s reply", msg, errText, c.reply)
				}
				start = start || l["level"] == "ERROR"
				episode = episode || strings.Contains(msg, "failure policies in force")
			}
			if !start || !episode {
				t.Fatalf("start-up says authentication failed: %v; failure episode says it: %v; logs:\n%v", start, episode, logs)
			}
		})
	}
}

// runAgentOnce starts the agent with -redis spec and JSON logs, makes one
// check, stops it and returns its log lines.
func runAgentOnce(t *testing.T, rulesFile, spec string) []map[string]any {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr harness.LogBuffer
	done := make(chan error, 1)
	jsonLogs := func(k string) (string, bool) { return "json", k == "RATION_LOG_FORMAT" }
	args := []string{"-rules", rulesFile, "-redis", spec, "-http", "127.0.0.1:0", "-grpc", "127.0.0.1:0"}
	go func() { done <- run(ctx, args, &stdout, &stderr, jsonLogs) }()
	parse := func() []map[string]any {
		var out []map[string]any
		for _, line := range strings.Split(stderr.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil {
				out = append(out, m)
			}
		}
		return out
	}
	var httpAddr string
	for deadline := time.Now().Add(30 * time.Second); httpAddr == ""; time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("agent exited: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent did not start in 30s:\n%s", stderr.String())
		}
		for _, l := range parse() {
			if l["msg"] == "gateway-agent started" {
				httpAddr, _ = l["http"].(string)
			}
		}
	}
	resp, err := http.Get("http://" + httpAddr + "/v1/check?k=v")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("agent: %v", err)
	}
	return parse()
}
