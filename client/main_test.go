package client_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/rules"
)

// agentAddr is the gRPC address of the agent the examples talk to: a real
// gateway-agent under -dev (in-memory store), started once for the package.
// The other tests start their own agents against redis-server.
var agentAddr string

const exampleRules = `
rules:
  - name: tenant-search
    match: {tenant: "*", endpoint: search}
    burst: 2
    rate: 1/h
`

func TestMain(m *testing.M) {
	stop, err := startDevAgent()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the examples' agent:", err)
		os.Exit(2)
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

func startDevAgent() (stop func(), err error) {
	dir, err := os.MkdirTemp("", "ration-client-example")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, []byte(exampleRules), 0o644); err != nil {
		return nil, err
	}
	cfg := agent.DevConfig()
	cfg.RulesFile = path
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.GRPCAddr = "127.0.0.1:0"
	// No leased rules here: noLeases keeps -dev from starting its embedded
	// coordinator.
	srv, err := agent.Start(context.Background(), cfg, slog.New(slog.DiscardHandler), noLeases{})
	if err != nil {
		return nil, err
	}
	agentAddr = srv.GRPCAddr()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		_ = os.RemoveAll(dir)
	}, nil
}

type noLeases struct{}

func (noLeases) Now() int64 { return 0 }
func (noLeases) Spend(context.Context, *rules.Rule, string, float64, int64) (bucket.Result, bool, bool) {
	return bucket.Result{}, false, false
}
func (noLeases) Refund(*rules.Rule, string, float64, bool) {}
func (noLeases) DownFor() time.Duration                    { return 0 }
