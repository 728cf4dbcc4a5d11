package goclient_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ration-dev/ration/client"
	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
)

// startAgent runs a real gateway-agent in-process against a real
// redis-server, on loopback ports.
func startAgent(t *testing.T, rulesYAML string) (*agent.Server, *harness.Redis) {
	t.Helper()
	r := harness.StartRedis(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(rulesYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.RulesFile = path
	cfg.Redis = r.Addr
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.DecisionTimeout = 500 * time.Millisecond // generous: -race on 2 shared cores
	srv, err := agent.Start(context.Background(), cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatalf("agent.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	deadline := time.Now().Add(15 * time.Second)
	for !srv.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("agent not ready within 15s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return srv, r
}

func newClient(t *testing.T, addr string, opts client.Options) *client.Client {
	t.Helper()
	c, err := client.New(addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
