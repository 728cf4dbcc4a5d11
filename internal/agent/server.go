package agent

import (
	"github.com/ration-dev/ration/internal/region"

	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ration-dev/ration/examples"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/coordclient"
	"github.com/ration-dev/ration/internal/grpcsafe"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/httpsafe"
	"github.com/ration-dev/ration/internal/rules"
	"github.com/ration-dev/ration/internal/tlsfiles"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// DevRules returns the sample rules -dev runs with: examples/rules.yaml,
// which coordinator -dev runs with too.
func DevRules() []byte { return examples.Rules() }

// Server is a running gateway-agent: the Service behind its gRPC and HTTP
// listeners, the rules watcher and the store prober.
type Server struct {
	Service  *Service
	Registry *prometheus.Registry
	cfg      Config
	logger   *slog.Logger
	watcher  *rules.Watcher
	grpc     *grpc.Server
	health   *health.Server
	http     *http.Server
	grpcLn   net.Listener
	httpLn   net.Listener
	closeFns []func()
	cancel   context.CancelFunc
	ready    atomic.Bool

	evictionPolicy, evictionWarning string

	holder         *holder.Leases
	holderDone     chan struct{}
	devCoordinator DevCoordinator

	// tls is the agent's TLS material (-tls-cert, ...), nil without it.
	tls       *tlsfiles.Source
	metrics   *http.Server // -metrics, nil when unset
	metricsLn net.Listener

	storeless bool           // no -redis: every rule is mode: leased (nostore.go)
	rules     *acceptedRules // the rules in force, when a rules file is watched
}

// startLeases builds the lease holder: against -coordinators, or under -dev
// against an embedded single-node coordinator (cfg.DevCoordinator). It
// returns nil (leased rules fall to their failure policy) when no leased
// rule is configured and no coordinator is given, and under -dev when
// there is no cfg.DevCoordinator to start (logged).
func (s *Server) startLeases(ctx context.Context, cfg Config, set *rules.Set) (Leases, error) {
	addrs := cfg.CoordinatorAddrs()
	var leased []string
	for _, r := range set.Rules() {
		if r.Mode.Leases() {
			leased = append(leased, r.Name)
		}
	}
	if len(addrs) == 0 && !cfg.Dev {
		if len(leased) > 0 {
			return nil, fmt.Errorf("agent: rules %v are mode: leased or auto but -coordinators is empty", leased)
		}
		return nil, nil
	}
	if len(addrs) == 0 {
		if cfg.DevCoordinator == nil {
			if len(leased) > 0 {
				s.logger.Warn("-dev without an embedded coordinator (Config.DevCoordinator is nil): leased rules decide by their failure policy", "rules", leased)
			}
			return nil, nil
		}
		// The embedded coordinator's Raft chatter (elections, state changes)
		// would bury the -dev guide; only its warnings are shown.
		devLog := slog.New(minLevel{s.logger.Handler(), slog.LevelWarn}).With("component", "dev-coordinator")
		node, addr, err := cfg.DevCoordinator(ctx, devLog, set)
		if err != nil {
			return nil, fmt.Errorf("agent: embedded dev coordinator: %w", err)
		}
		s.devCoordinator = node
		s.closeFns = append(s.closeFns, func() { _ = node.Close() })
		addrs = []string{addr}
	}
	opts := coordclient.Options{Logger: s.logger}
	switch {
	case s.devCoordinator != nil:
		// The embedded coordinator is plaintext on loopback.
	case s.tls != nil:
		src := s.tls
		if id := tlsfiles.Names(src.Leaf(), tlsfiles.RoleAgent); !slices.Contains(id, cfg.AgentID) {
			// The coordinators would refuse every renewal: say so now.
			s.logger.Error("the -tls-cert does not name this agent: the coordinators will refuse its leases",
				"agent_id", cfg.AgentID, "want_uri_san", tlsfiles.URI(tlsfiles.RoleAgent, cfg.AgentID), "cert_agents", id)
		}
		opts.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(src.ClientCredentials("", nil))}
	default: // -insecure or -dev: Check refuses plaintext without either
		s.logger.Warn("PLAINTEXT to the coordinators by -insecure or -dev: anyone on the path can read and alter lease traffic", "coordinators", cfg.Coordinators)
	}
	client := coordclient.New(addrs, opts)
	s.closeFns = append(s.closeFns, func() { _ = client.Close() })
	h, err := holder.New(holder.Options{
		Client: client, Holder: cfg.AgentID, Region: cfg.Region,
		ColdStart: cfg.DecisionTimeout, Logger: s.logger, Registry: s.Registry,
	})
	if err != nil {
		return nil, err
	}
	s.holder = h
	return h, nil
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

	if cfg.TLS.Enabled() {
		src, err := tlsfiles.Open(cfg.TLS, tlsfiles.Options{Logger: logger.With("component", "tls"), Interval: cfg.TLSReloadInterval})
		if err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		s.tls = src
		s.closeFns = append(s.closeFns, src.Close)
	}
	set, err := loadRules(cfg)
	if err != nil {
		return nil, err
	}
	if err := set.CheckRegion(region.ID(cfg.Region)); err != nil {
		return nil, fmt.Errorf("agent: -region %s: %w", cfg.Region, err)
	}
	s.storeless = cfg.Redis == "" && !cfg.Dev
	if s.storeless {
		if err := checkStoreless(set); err != nil {
			return nil, fmt.Errorf("agent: %s: %w (or run with -dev for an in-memory store)", rulesName(cfg), err)
		}
	}
	store, err := s.openStore(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if leases == nil {
		if leases, err = s.startLeases(ctx, cfg, set); err != nil {
			return nil, err
		}
	}
	svc, err := New(Options{
		Rules: StaticRules{Set: set}, Store: store, Leases: leases, Registry: s.Registry, Logger: logger,
		DecisionTimeout: cfg.DecisionTimeout, Breaker: cfg.Breaker, Region: region.ID(cfg.Region),
	})
	if err != nil {
		return nil, err
	}
	s.Service = svc
	if cfg.Record != "" {
		stop, err := svc.StartRecording(cfg.Record, cfg.AgentID)
		if err != nil {
			return nil, err
		}
		s.closeFns = append(s.closeFns, func() { _ = stop() })
	}
	if cfg.RulesFile != "" {
		// Decisions read the accepted set from here on: the watcher's,
		// unless the agent refused it.
		s.rules = newAcceptedRules(set)
		s.watcher = rules.NewWatcher(cfg.RulesFile, set, logger, cfg.ReloadInterval,
			func(err error) { svc.metrics.rulesReloads.WithLabelValues("error").Inc() },
			func(set *rules.Set) {
				if err := s.check(set); err != nil {
					s.rules.refuse(err)
					svc.metrics.rulesReloads.WithLabelValues("error").Inc()
					logger.Error("rules reload refused; the previous rules stay in force", "file", cfg.RulesFile, "err", err,
						"refused_rules_version", set.Hash(), "rules_version", s.rules.Current().Hash())
					return
				}
				s.rules.accept(set)
				if s.devCoordinator != nil {
					s.devCoordinator.SetRules(set)
				}
				svc.metrics.rulesReloads.WithLabelValues("ok").Inc()
				svc.RulesChanged(set)
				logger.Info("rules reloaded", "rules", len(set.Rules()), "rules_version", set.Hash())
			})
		svc.rules = s.rules
	}

	if s.grpcLn, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, fmt.Errorf("agent: gRPC listen %s: %w", cfg.GRPCAddr, err)
	}
	if s.httpLn, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("agent: HTTP listen %s: %w", cfg.HTTPAddr, err)
	}
	grpcOpts := grpcsafe.ServerOptions(logger, svc.metrics.grpcPanics.Inc)
	if cfg.ListenTLS {
		// The gateway side: a certificate the gateway trusts, and, with
		// -listen-client-auth, only gateways with one of the CA's
		// certificates get a decision.
		var tcfg *tls.Config
		if cfg.ListenClientAuth {
			tcfg = s.tls.ServerConfig(nil)
		} else {
			tcfg = s.tls.ServerConfigNoClientCert()
		}
		grpcOpts = append(grpcOpts, grpc.Creds(credentials.NewTLS(tcfg.Clone())))
		s.httpLn = tls.NewListener(s.httpLn, tcfg)
	}
	if cfg.MetricsAddr != "" {
		if s.metricsLn, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
			return nil, fmt.Errorf("agent: -metrics listen %s: %w", cfg.MetricsAddr, err)
		}
		s.metrics = &http.Server{Handler: httpsafe.Recover(s.metricsHandler(), logger), ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	}
	s.grpc = grpc.NewServer(grpcOpts...)
	rationv1.RegisterRateLimiterServer(s.grpc, &grpcServer{svc: svc})
	registerEnvoy(s.grpc, svc) // envoy.service.ratelimit.v3.RateLimitService (envoy.go)
	// The standard health service lets gRPC load balancers and probes check
	// the agent, and its Check is the cheapest unary call there is: the
	// benchmark floor of any unary decision.
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING) // until the store answers
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.http = &http.Server{Handler: httpsafe.Recover(s.Handler(), logger), ReadHeaderTimeout: 5 * time.Second,
		// A check is one small request: a client that takes longer to
		// send it, or to read the answer, holds a connection for nothing.
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	go func() { _ = s.grpc.Serve(s.grpcLn) }()
	go func() { _ = s.http.Serve(s.httpLn) }()
	if s.metrics != nil {
		go func() { _ = s.metrics.Serve(s.metricsLn) }()
	}
	go svc.RunProber(runCtx)
	go svc.RunHotMarks(runCtx)
	if s.holder != nil {
		s.holderDone = make(chan struct{})
		go func() { defer close(s.holderDone); s.holder.Run(runCtx) }()
	}
	if s.watcher != nil {
		go s.watcher.Run(runCtx)
	}
	go s.waitReady(runCtx)
	ok = true
	logger.Info("gateway-agent started", "coordinators", cfg.Coordinators, "grpc", s.grpcLn.Addr().String(), "http", s.httpLn.Addr().String(),
		"region", cfg.Region, "agent_id", cfg.AgentID, "rules", len(set.Rules()), "rules_version", set.Hash(), "dev", cfg.Dev, "store", storeName(cfg))
	return s, nil
}

// check is whether the agent can run set: one with mode: redis rules needs
// a store.
func (s *Server) check(set *rules.Set) error {
	if s.storeless {
		if err := checkStoreless(set); err != nil {
			return fmt.Errorf("agent: %w; restart the agent with -redis to add them", err)
		}
	}
	return nil
}

func storeName(cfg Config) string {
	switch {
	case cfg.Redis != "":
		return "redis"
	case cfg.Dev:
		return "memory"
	default:
		return "none"
	}
}

func rulesName(cfg Config) string {
	if cfg.RulesFile != "" {
		return cfg.RulesFile
	}
	return examples.RulesFile + " (embedded)"
}

func loadRules(cfg Config) (*rules.Set, error) {
	if cfg.RulesFile != "" {
		return rules.Load(cfg.RulesFile)
	}
	return rules.Parse(examples.RulesFile+" (embedded)", examples.Rules())
}

func (s *Server) openStore(ctx context.Context, cfg Config) (Store, error) {
	if s.storeless {
		return noStore{}, nil
	}
	if cfg.Dev && cfg.Redis == "" {
		return bucket.NewMemoryStore(nil), nil
	}
	client, err := bucket.OpenRedisTLS(cfg.Redis, cfg.DecisionTimeout, cfg.RedisTLS)
	if err != nil {
		return nil, fmt.Errorf("agent: -redis: %w", err)
	}
	s.closeFns = append(s.closeFns, func() { _ = client.Close() })
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	policy, warning, err := bucket.CheckEviction(cctx, client)
	switch {
	case err != nil:
		s.logger.Warn("could not read Redis maxmemory-policy; buckets may be evicted silently if it is not noeviction", "err", err)
	case warning != "":
		s.logger.Warn(warning, "maxmemory_policy", policy)
	default:
		s.logger.Info("Redis maxmemory-policy is safe", "maxmemory_policy", policy)
	}
	st := bucket.NewRedisStore(client, bucket.RedisOptions{Timeout: cfg.DecisionTimeout, Logger: s.logger})
	s.evictionPolicy = policy
	s.evictionWarning = warning
	return st, nil
}

// waitReady probes the store until it answers once.
func (s *Server) waitReady(ctx context.Context) {
	for {
		if err := s.Service.Probe(ctx); err == nil {
			s.ready.Store(true)
			s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
			s.health.SetServingStatus("ration.v1.RateLimiter", healthpb.HealthCheckResponse_SERVING)
			s.logger.Info("store answered: ready")
			if s.evictionPolicy != "" {
				v := 0.0
				if s.evictionWarning == "" {
					v = 1
				}
				s.Service.metrics.redisEvictionSafe.Set(v)
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
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
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "not ready: store has not answered yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
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

// Ready reports whether the agent has rules and the store answered once.
func (s *Server) Ready() bool { return s.ready.Load() }

// Reload re-reads the rules file now (SIGHUP). Invalid files keep the old
// rules and return the problems, and so do rules this agent cannot run (a
// mode: redis rule in an agent without -redis), for as long as the file
// holds them.
func (s *Server) Reload() error {
	if s.watcher == nil {
		return errors.New("agent: no rules file to reload (running on the embedded dev rules)")
	}
	if err := s.watcher.Reload(); err != nil {
		return err
	}
	return s.rules.refusal()
}

// Shutdown stops accepting, lets in-flight requests finish within ctx, and
// releases the store.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.health.Shutdown()
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
	s.closeAll()
	return err
}

func (s *Server) closeAll() {
	if s.cancel != nil {
		s.cancel()
	}
	if s.holderDone != nil {
		// The holder releases its leases (bounded by its request timeout)
		// before the client and any embedded coordinator close below.
		<-s.holderDone
	}
	if s.grpcLn != nil && s.grpc == nil {
		_ = s.grpcLn.Close()
	}
	if s.httpLn != nil && s.http == nil {
		_ = s.httpLn.Close()
	}
	for i := len(s.closeFns) - 1; i >= 0; i-- {
		s.closeFns[i]()
	}
	s.closeFns = nil
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
