package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ration-dev/ration/examples"
	"github.com/ration-dev/ration/internal/grpcsafe"
	"github.com/ration-dev/ration/internal/httpsafe"
	"github.com/ration-dev/ration/internal/rlqs"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

// DevRules returns the sample rules -dev runs with: examples/rules.yaml,
// which coordinator -dev runs with too.
func DevRules() []byte { return examples.Rules() }

// Server is a running gateway-agent: the decision side (Core: the
// Service, the rules watcher, the store prober, the lease holder) behind
// its gRPC and HTTP listeners.
type Server struct {
	Service  *Service
	Registry *prometheus.Registry
	// RLQS is the Envoy Rate Limit Quota Service on the gRPC listener.
	RLQS   *rlqs.Server
	core   *Core
	cfg    Config
	logger *slog.Logger
	grpc   *grpc.Server
	health *health.Server
	http   *http.Server
	grpcLn net.Listener
	httpLn net.Listener

	metrics   *http.Server // -metrics, nil when unset
	metricsLn net.Listener
}

// Start builds and starts an agent. It returns once both listeners are
// bound; the store is probed in the background (readiness waits for it).
// Leased rules are served by a holder.Leases talking to -coordinators, or
// under -dev to an embedded single-node coordinator; leases, when not nil,
// replaces that (tests).
func Start(ctx context.Context, cfg Config, logger *slog.Logger, leases Leases) (*Server, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, logger: logger, Registry: prometheus.NewRegistry()}
	s.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ok := false
	defer func() {
		if !ok {
			s.closeAll()
		}
	}()

	core, err := NewCore(ctx, cfg, CoreOptions{Logger: logger, Registry: s.Registry, Leases: leases})
	if err != nil {
		return nil, err
	}
	s.core = core
	svc := core.Service
	s.Service = svc

	if s.grpcLn, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, fmt.Errorf("agent: gRPC listen %s: %w", cfg.GRPCAddr, err)
	}
	if s.httpLn, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("agent: HTTP listen %s: %w", cfg.HTTPAddr, err)
	}
	grpcOpts := grpcsafe.ServerOptions(logger, svc.metrics.grpcPanics.Inc)
	if cfg.ListenTLS {
		// The gateway side: a certificate the gateway trusts, and, with
		// -listen-client-auth, only gateways get a decision: a certificate
		// naming ration://gateway/<name>. The fleet's other certificates
		// are of the same CA (every agent's, the coordinators', the
		// operators'), and none of them is a gateway.
		var tcfg *tls.Config
		if cfg.ListenClientAuth {
			tcfg = core.TLS().ServerConfig(tlsfiles.RequireRole(tlsfiles.RoleGateway))
		} else {
			tcfg = core.TLS().ServerConfigNoClientCert()
		}
		// A failed handshake on -grpc is logged at most once a minute
		// (net/http's on -http go through httpsafe.ErrorLog).
		hs := tlsfiles.NewHandshakeLog(logger.With("component", "tls"), "-grpc", time.Minute)
		grpcOpts = append(grpcOpts, grpc.Creds(hs.Credentials(credentials.NewTLS(tcfg.Clone()))))
		s.httpLn = tls.NewListener(s.httpLn, tcfg)
	}
	if cfg.MetricsAddr != "" {
		if s.metricsLn, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
			return nil, fmt.Errorf("agent: -metrics listen %s: %w", cfg.MetricsAddr, err)
		}
		s.metrics = &http.Server{Handler: httpsafe.Recover(s.metricsHandler(), logger), ErrorLog: httpsafe.ErrorLog(logger, time.Minute), ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	}
	// The codec is protobuf's but for AllowBatch's request (wire.go).
	grpcOpts = append(grpcOpts, grpc.ForceServerCodecV2(newCodec()))
	if cfg.GRPCWorkers > 0 {
		grpcOpts = append(grpcOpts, grpc.NumStreamWorkers(uint32(cfg.GRPCWorkers)))
	}
	s.grpc = grpc.NewServer(grpcOpts...)
	s.grpc.RegisterService(serviceDesc(), &grpcServer{svc: svc})
	registerEnvoy(s.grpc, svc) // envoy.service.ratelimit.v3.RateLimitService (envoy.go)
	// envoy.service.rate_limit_quota.v3.RateLimitQuotaService (rlqs.go)
	s.RLQS = registerRLQS(s.grpc, svc, cfg.RLQS, logger, s.Registry)
	// The standard health service lets gRPC load balancers and probes check
	// the agent, and its Check is the cheapest unary call there is: the
	// benchmark floor of any unary decision.
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING) // until the store answers
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.http = &http.Server{Handler: httpsafe.Recover(s.Handler(), logger), ErrorLog: httpsafe.ErrorLog(logger, time.Minute), ReadHeaderTimeout: 5 * time.Second,
		// A check is one small request: a client that takes longer to
		// send it, or to read the answer, holds a connection for nothing.
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10}

	go func() { _ = s.grpc.Serve(s.grpcLn) }()
	go func() { _ = s.http.Serve(s.httpLn) }()
	if s.metrics != nil {
		go func() { _ = s.metrics.Serve(s.metricsLn) }()
	}
	core.Run(ctx, func() {
		s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		s.health.SetServingStatus("ration.v1.RateLimiter", healthpb.HealthCheckResponse_SERVING)
	})
	ok = true
	set := core.StartRules()
	logger.Info("gateway-agent started", "coordinators", cfg.Coordinators, "grpc", s.grpcLn.Addr().String(), "http", s.httpLn.Addr().String(),
		"region", cfg.Region, "agent_id", cfg.AgentID, "rules", len(set.Rules()), "rules_version", set.Hash(), "dev", cfg.Dev, "store", storeName(cfg))
	return s, nil
}

// Handler serves the agent's HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/allow", s.Service.handleAllow)
	mux.HandleFunc("/v1/check", s.Service.handleCheck)
	if s.cfg.MetricsAddr == "" {
		mux.Handle("/metrics", promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{Registry: s.Registry}))
	}
	s.probes(mux)
	return mux
}

// metricsHandler serves -metrics: /metrics and the probes.
func (s *Server) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{Registry: s.Registry}))
	s.probes(mux)
	return mux
}

func (s *Server) probes(mux *http.ServeMux) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if cause := s.core.Wedged(); cause != "" {
			http.Error(w, "wedged: "+cause, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := s.core.NotReady(); why != "" {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		// Ready stays ready through a store node's outage (the rules on
		// the other nodes decide; those on it follow their policies): the
		// detail says which nodes, and which of their slots, are out.
		_, _ = w.Write([]byte("ready\n" + s.core.Service.nodesDetail(time.Now())))
	})
}

// MetricsAddr is the bound -metrics address, "" when it is unset.
func (s *Server) MetricsAddr() string {
	if s.metricsLn == nil {
		return ""
	}
	return s.metricsLn.Addr().String()
}

// GRPCAddr is the bound gRPC address.
func (s *Server) GRPCAddr() string { return s.grpcLn.Addr().String() }

// HTTPAddr is the bound HTTP address.
func (s *Server) HTTPAddr() string { return s.httpLn.Addr().String() }

// Ready reports whether the agent can decide every rule: the store warm,
// the coordinators answering, the leases known in advance held.
func (s *Server) Ready() bool { return s.core.Ready() }

// NotReady is what readiness waits for, "" once ready.
func (s *Server) NotReady() string { return s.core.NotReady() }

// Wedged is why /healthz fails (the agent no longer does its job), ""
// while it does not.
func (s *Server) Wedged() string { return s.core.Wedged() }

// Reload re-reads the rules file now (SIGHUP). Invalid files keep the old
// rules and return the problems, and so do rules this agent cannot run (a
// mode: redis rule in an agent without -redis), for as long as the file
// holds them.
func (s *Server) Reload() error { return s.core.Reload() }

// Shutdown stops accepting, lets in-flight requests finish within ctx, and
// releases the leases and the store. It returns once ctx is done whatever
// a handler or the background work is doing: a wedged agent must still
// stop when told to.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.health.Shutdown()
	// RLQS streams last as long as Envoy keeps them, and GracefulStop
	// waits for them: they are ended first (Envoy opens them again on
	// another agent).
	s.RLQS.Stop()
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		s.grpc.Stop()
		err = ctx.Err()
	}
	if s.metrics != nil {
		_ = s.metrics.Shutdown(ctx)
	}
	if herr := s.http.Shutdown(ctx); herr != nil && err == nil {
		err = herr
	}
	if ctx.Err() != nil {
		// Past the limit: connections still open (handlers that never
		// returned) are cut, not waited for.
		_ = s.http.Close()
		if s.metrics != nil {
			_ = s.metrics.Close()
		}
	}
	closed := make(chan struct{})
	go func() { s.closeAll(); close(closed) }()
	select {
	case <-closed:
	case <-ctx.Done():
		s.logger.Error("shutdown limit reached before the leases were released and the store closed; stopping anyway", "err", ctx.Err())
		if err == nil {
			err = ctx.Err()
		}
	}
	return err
}

func (s *Server) closeAll() {
	if s.grpcLn != nil && s.grpc == nil {
		_ = s.grpcLn.Close()
	}
	if s.httpLn != nil && s.http == nil {
		_ = s.httpLn.Close()
	}
	if s.core != nil {
		s.core.Close()
	}
}

// minLevel drops records below min.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(a []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(a), h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.min}
}
