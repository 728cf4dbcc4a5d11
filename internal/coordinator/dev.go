package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/ration-dev/ration/internal/rules"
)

// StartDev starts a single-node coordinator for `gateway-agent -dev` and
// tests of agents: loopback ports chosen by the kernel, a temporary data
// dir deleted on Close/Shutdown, a bootstrapped one-voter cluster, no HTTP
// server, plaintext (-dev), and set as its rules. Its admin API is on a
// loopback port of its own (Node.AdminAddr). It returns once the node leads and serves,
// with the gRPC address to give NewClient. Its metrics are in
// Node.Registry.
func StartDev(ctx context.Context, logger *slog.Logger, set *rules.Set) (*Node, string, error) {
	if set == nil {
		return nil, "", fmt.Errorf("%w: StartDev needs a rules set", ErrInvalidConfig)
	}
	dir, err := os.MkdirTemp("", "ration-coordinator-dev-")
	if err != nil {
		return nil, "", fmt.Errorf("coordinator: dev data dir: %w", err)
	}
	cfg := DevConfig()
	cfg.RaftAddr = "127.0.0.1:0"
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.AdminAddr = "127.0.0.1:0"
	cfg.HTTPAddr = ""
	cfg.DataDir = dir
	cfg.Rules = set
	n, err := Start(ctx, cfg, logger, nil)
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", err
	}
	n.removeDir = dir
	if _, err := n.WaitReady(ctx); err != nil {
		n.Close()
		return nil, "", err
	}
	return n, n.GRPCAddr(), nil
}
