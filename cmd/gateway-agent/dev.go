package main

import (
	"context"
	"log/slog"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/rules"
)

// startDevCoordinator is the -dev wiring: the single-node coordinator an
// agent under -dev embeds when -coordinators is empty. This file is the
// only place the agent's binary imports internal/coordinator (and so
// hashicorp/raft and BoltDB); internal/agent reaches coordinators through
// internal/coordclient only (TestDevWiringAloneImportsTheCoordinator).
func startDevCoordinator(ctx context.Context, logger *slog.Logger, set *rules.Set) (agent.DevCoordinator, string, error) {
	node, addr, err := coordinator.StartDev(ctx, logger, set)
	if err != nil {
		return nil, "", err
	}
	return node, addr, nil
}
