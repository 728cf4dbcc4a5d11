package agent

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ration-dev/ration/internal/rlqs"
)

// registerRLQS adds Envoy's Rate Limit Quota Service (internal/rlqs) to
// the agent's gRPC server, beside RLS v3: one rules file for both, bucket
// ids matched as RLS descriptors are (EnvoyDomainKey set to the stream's
// domain), leased rules' assignments funded by the agent's leases.
func registerRLQS(g *grpc.Server, svc *Service, logger *slog.Logger, reg prometheus.Registerer) *rlqs.Server {
	o := rlqs.Options{Rules: svc.rules, Logger: logger.With("component", "rlqs"), Registry: reg}
	if f, ok := svc.leases.(rlqs.Funds); ok {
		o.Funds = f
	}
	s := rlqs.New(o)
	s.Register(g)
	return s
}
