package agent

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ration-dev/ration/internal/rlqs"
)

// registerRLQS adds Envoy's Rate Limit Quota Service (internal/rlqs) to
// the agent's gRPC server, beside RLS v3: one rules file for both, bucket
// ids matched as RLS descriptors are (EnvoyDomainKey set to the stream's
// domain), leased rules' assignments funded by the agent's leases.
func registerRLQS(g *grpc.Server, svc *Service, logger *slog.Logger, reg prometheus.Registerer) *rlqs.Server {
	// Tick: each stream's timer wakes the agent every Tick, and at the
	// package's 100ms the wake-ups of 16 streams cost the agent more CPU
	// than their reports (scripts/bench-rlqs.sh). A report settles what it
	// closes as it arrives; the timer only forfeits what no report closes
	// (after a grace of seconds) and abandons idle buckets (after a
	// minute), for which a second is resolution enough.
	o := rlqs.Options{Rules: svc.rules, Logger: logger.With("component", "rlqs"), Registry: reg, Tick: time.Second}
	if f, ok := svc.leases.(rlqs.Funds); ok {
		o.Funds = f
	}
	s := rlqs.New(o)
	s.Register(g)
	return s
}
