package agent

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ration-dev/ration/examples"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/coordclient"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/region"
	"github.com/ration-dev/ration/internal/rules"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

// Core is the decision side of an agent: the rules in force and the
// watcher that reloads them, the store, the lease holder and the Service
// that decides with them, and the goroutines that keep them going (store
// prober, hot-key marks, lease renewals). It serves no listener.
//
// Start (the gateway-agent sidecar) builds one and puts its gRPC and HTTP
// listeners in front of it; the public package limiter builds one and
// decides in the caller's process. Both go through NewCore, so the two
// decide alike.
type Core struct {
	// Service decides requests.
	Service *Service

	cfg    Config
	opts   CoreOptions
	logger *slog.Logger
	set    *rules.Set // the rules at start

	watcher        *rules.Watcher
	rules          *acceptedRules // the rules in force, when a rules file is watched
	holder         *holder.Leases
	loop           interface{ Run(context.Context) } // the holder's renewal loop, or a replacement's (CoreOptions.Leases)
	holderDone     chan struct{}
	devCoordinator DevCoordinator
	tls            *tlsfiles.Source // the agent's TLS material, nil without it
	storeless      bool             // no store: every rule is mode: leased (nostore.go)

	evictionPolicy, evictionWarning string
	ready                           atomic.Bool
	why                             atomic.Value // string: what readiness waits for
	storeOK                         bool         // the store answered and is warm (waitReady's goroutine only)

	closeFns  []func()
	cancel    context.CancelFunc
	closeOnce sync.Once
}

// CoreOptions are NewCore's collaborators beyond the Config.
type CoreOptions struct {
	Logger *slog.Logger // nil: discard
	// Registry receives the agent's metrics (the Service's and the lease
	// holder's). Nil: a registry of its own, not exported.
	Registry prometheus.Registerer
	// Leases, when not nil, replaces the holder built from
	// cfg.Coordinators (tests).
	Leases Leases
	// Name is how errors that depend on the rules or on an address name a
	// setting, given its flag ("-redis", "-coordinators", "-region"). Nil
	// names the flag; the embedded limiter names its Config fields.
	Name func(flag string) string
}

func (o CoreOptions) name(flag string) string {
	if o.Name == nil {
		return flag
	}
	return o.Name(flag)
}

// NewCore builds the decision side of an agent from cfg: it opens the TLS
// files, loads and checks the rules, opens the store and the lease holder
// and builds the Service, and starts nothing; Run does. On error it
// releases what it opened. cfg must have passed CheckCore (Start's Check
// includes it).
func NewCore(ctx context.Context, cfg Config, o CoreOptions) (*Core, error) {
	if err := cfg.CheckCore(); err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	c := &Core{cfg: cfg, opts: o, logger: o.Logger}
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()

	if cfg.TLS.Enabled() {
		opts := tlsfiles.Options{Logger: c.logger.With("component", "tls"), Interval: cfg.TLSReloadInterval}
		if cfg.Coordinators != "" {
			// A rotation must not turn this agent into another: its
			// renewals would be refused, or made as that agent.
			opts.Check = func(leaf *x509.Certificate) error {
				if !tlsfiles.Has(leaf, tlsfiles.RoleAgent, cfg.AgentID) {
					return fmt.Errorf("it names agents %q, not this one (-id %q: URI SAN %s)",
						tlsfiles.Names(leaf, tlsfiles.RoleAgent), cfg.AgentID, tlsfiles.URI(tlsfiles.RoleAgent, cfg.AgentID))
				}
				return nil
			}
		}
		src, err := tlsfiles.Open(cfg.TLS, opts)
		if err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		c.tls = src
		c.closeFns = append(c.closeFns, src.Close)
	}
	set, err := loadRules(cfg)
	if err != nil {
		return nil, err
	}
	c.set = set
	if err := set.CheckRegion(region.ID(cfg.Region)); err != nil {
		return nil, fmt.Errorf("agent: %s %s: %w", o.name("-region"), cfg.Region, err)
	}
	c.storeless = cfg.Redis == "" && !cfg.Dev
	if c.storeless {
		if err := c.checkStoreless(set); err != nil {
			hint := " (or run with -dev for an in-memory store)"
			if o.Name != nil {
				hint = ""
			}
			return nil, fmt.Errorf("agent: %s: %w%s", rulesName(cfg), err, hint)
		}
	}
	store, err := c.openStore(ctx)
	if err != nil {
		return nil, err
	}
	leases := o.Leases
	if leases == nil {
		if leases, err = c.startLeases(ctx, set); err != nil {
			return nil, err
		}
	}
	svc, err := New(Options{
		Rules: StaticRules{Set: set}, Store: store, Leases: leases, Registry: o.Registry, Logger: c.logger,
		DecisionTimeout: cfg.DecisionTimeout, FirstGrantTimeout: cfg.FirstGrant(), Breaker: cfg.Breaker, Region: region.ID(cfg.Region),
		LocalDenials: cfg.LocalDenials,
	})
	if err != nil {
		return nil, err
	}
	c.Service = svc
	if c.holder != nil {
		c.loop = c.holder
	} else if l, ok := leases.(interface{ Run(context.Context) }); ok {
		// A replacement with a loop of its own runs, and is waited for at
		// Close, as the holder's would be.
		c.loop = l
	}
	var stepped func() time.Time
	if st, ok := leases.(interface{ Stepped() time.Time }); ok {
		stepped = st.Stepped
	}
	svc.watch = newWatchdog(cfg.StallLimit(), watchTick, stepped, c.logger, func(wedged bool) {
		svc.metrics.wedged.Set(map[bool]float64{false: 0, true: 1}[wedged])
	})
	if cfg.Record != "" {
		stop, err := svc.StartRecording(cfg.Record, cfg.AgentID)
		if err != nil {
			return nil, err
		}
		c.closeFns = append(c.closeFns, func() { _ = stop() })
	}
	if cfg.RulesFile != "" {
		c.watchRules(set)
	}
	ok = true
	return c, nil
}

// watchRules makes decisions read the accepted set from here on: the
// watcher's, unless the agent refused it.
func (c *Core) watchRules(set *rules.Set) {
	svc, logger, file := c.Service, c.logger, c.cfg.RulesFile
	c.rules = newAcceptedRules(set)
	c.watcher = rules.NewWatcher(file, set, logger, c.cfg.ReloadInterval,
		func(err error) { svc.metrics.rulesReloads.WithLabelValues("error").Inc() },
		func(set *rules.Set) {
			if err := c.check(set); err != nil {
				c.rules.refuse(err)
				svc.metrics.rulesReloads.WithLabelValues("error").Inc()
				logger.Error("rules reload refused; the previous rules stay in force", "file", file, "err", err,
					"refused_rules_version", set.Hash(), "rules_version", c.rules.Current().Hash())
				return
			}
			c.rules.accept(set)
			c.prefetch(set)
			if c.devCoordinator != nil {
				c.devCoordinator.SetRules(set)
			}
			svc.metrics.rulesReloads.WithLabelValues("ok").Inc()
			svc.RulesChanged(set)
			logger.Info("rules reloaded", "rules", len(set.Rules()), "rules_version", set.Hash())
		})
	svc.rules = c.rules
}

// Run starts the background work (store prober and readiness, hot-key
// marks, lease renewals, the rules watcher) until Close; ctx's values
// are kept, not its cancellation. onReady, if not nil, is called once,
// when the agent first can decide every rule (ready.go).
func (c *Core) Run(ctx context.Context, onReady func()) {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel
	go c.Service.RunProber(runCtx)
	go c.Service.RunHotMarks(runCtx)
	go c.Service.watch.run(runCtx)
	if c.loop != nil {
		c.holderDone = make(chan struct{})
		go func() { defer close(c.holderDone); c.loop.Run(runCtx) }()
	}
	if c.watcher != nil {
		go c.watcher.Run(runCtx)
	}
	go c.waitReady(runCtx, onReady)
}

// Ready reports whether the agent can decide every rule (ready.go).
func (c *Core) Ready() bool { return c.ready.Load() }

// Wedged is why the agent no longer does its job (a decision in flight,
// or the lease loop without a step, for longer than the stall limit),
// "" while it does.
func (c *Core) Wedged() string { return c.Service.watch.wedged() }

// watchTick is the watchdog's resolution: a wedge shows on /healthz
// within the stall limit plus two ticks.
const watchTick = time.Second

// StartRules is the rules the core started with.
func (c *Core) StartRules() *rules.Set { return c.set }

// TLS is the agent's TLS material (-tls-cert, ...), nil without it.
func (c *Core) TLS() *tlsfiles.Source { return c.tls }

// Reload re-reads the rules file now (SIGHUP). Invalid files keep the old
// rules and return the problems, and so do rules this agent cannot run (a
// mode: redis rule in an agent without a store), for as long as the file
// holds them.
func (c *Core) Reload() error {
	if c.watcher == nil {
		return errors.New("agent: no rules file to reload (running on the embedded dev rules)")
	}
	if err := c.watcher.Reload(); err != nil {
		return err
	}
	return c.rules.refusal()
}

// Close stops the background work, releases the leases (bounded by the
// holder's request timeout) and then closes the coordinator client, the
// store, the admission log and the TLS files. It may be called more than
// once.
func (c *Core) Close() {
	c.closeOnce.Do(func() {
		if c.cancel != nil {
			c.cancel()
		}
		if c.holderDone != nil {
			// The holder releases its leases before the client and any
			// embedded coordinator close below.
			<-c.holderDone
		}
		for i := len(c.closeFns) - 1; i >= 0; i-- {
			c.closeFns[i]()
		}
		c.closeFns = nil
	})
}

// check is whether the agent can run set: one with mode: redis rules needs
// a store.
func (c *Core) check(set *rules.Set) error {
	if c.storeless {
		if err := c.checkStoreless(set); err != nil {
			return fmt.Errorf("agent: %w; restart the agent with %s to add them", err, c.opts.name("-redis"))
		}
	}
	return nil
}

// checkStoreless is nil when set can run without a store, else the error
// that names its mode: redis rules.
func (c *Core) checkStoreless(set *rules.Set) error {
	if names := redisRules(set); len(names) > 0 {
		r := c.opts.name("-redis")
		return fmt.Errorf("%s: rules %v are mode: redis or auto and need the region's Redis; "+
			"only an agent whose rules are all mode: leased runs without %s", r, names, r)
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

func (c *Core) openStore(ctx context.Context) (Store, error) {
	cfg := c.cfg
	if c.storeless {
		return noStore{}, nil
	}
	if cfg.Dev && cfg.Redis == "" {
		return bucket.NewMemoryStore(nil), nil
	}
	client, err := bucket.OpenRedisTLS(cfg.Redis, cfg.DecisionTimeout, cfg.RedisTLS)
	if err != nil {
		return nil, fmt.Errorf("agent: %s: %w", c.opts.name("-redis"), err)
	}
	c.closeFns = append(c.closeFns, func() { _ = client.Close() })
	st := bucket.NewRedisStore(client, bucket.RedisOptions{Timeout: cfg.DecisionTimeout, Logger: c.logger})
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// A wrong password is said as such, once, at start: the checks below
	// would only report that they could not read what they check.
	if err := st.Ping(cctx); errors.Is(err, bucket.ErrAuth) {
		c.logger.Error("Redis refused the agent's credentials (authentication failed): check the user and password of "+c.opts.name("-redis")+
			"; until they are right every decision on the store goes to its rule's failure policy", "err", err)
		return st, nil
	}
	policy, warning, err := bucket.CheckEviction(cctx, client)
	switch {
	case err != nil:
		c.logger.Warn("could not read Redis maxmemory-policy; buckets may be evicted silently if it is not noeviction", "err", err)
	case warning != "":
		c.logger.Warn(warning, "maxmemory_policy", policy)
	default:
		c.logger.Info("Redis maxmemory-policy is safe", "maxmemory_policy", policy)
	}
	switch warning, err := bucket.CheckVersion(cctx, client); {
	case err != nil:
		c.logger.Warn("could not read the Redis version; the bucket script needs Redis >= "+bucket.MinRedisVersion, "err", err)
	case warning != "":
		c.logger.Error(warning)
	}
	c.evictionPolicy = policy
	c.evictionWarning = warning
	return st, nil
}

// startLeases builds the lease holder: against cfg.Coordinators, or under
// -dev against an embedded single-node coordinator (cfg.DevCoordinator).
// It returns nil (leased rules fall to their failure policy) when no
// leased rule is configured and no coordinator is given, and under -dev
// when there is no cfg.DevCoordinator to start (logged).
func (c *Core) startLeases(ctx context.Context, set *rules.Set) (Leases, error) {
	cfg := c.cfg
	addrs := cfg.CoordinatorAddrs()
	var leased []string
	for _, r := range set.Rules() {
		if r.Mode.Leases() {
			leased = append(leased, r.Name)
		}
	}
	if len(addrs) == 0 && !cfg.Dev {
		if len(leased) > 0 {
			return nil, fmt.Errorf("agent: rules %v are mode: leased or auto but %s is empty", leased, c.opts.name("-coordinators"))
		}
		return nil, nil
	}
	if len(addrs) == 0 {
		if cfg.DevCoordinator == nil {
			if len(leased) > 0 {
				c.logger.Warn("-dev without an embedded coordinator (Config.DevCoordinator is nil): leased rules decide by their failure policy", "rules", leased)
			}
			return nil, nil
		}
		// The embedded coordinator's Raft chatter (elections, state changes)
		// would bury the -dev guide; only its warnings are shown.
		devLog := slog.New(minLevel{c.logger.Handler(), slog.LevelWarn}).With("embedded", "coordinator") // its own loggers name their component
		node, addr, err := cfg.DevCoordinator(ctx, devLog, set)
		if err != nil {
			return nil, fmt.Errorf("agent: embedded dev coordinator: %w", err)
		}
		c.devCoordinator = node
		c.closeFns = append(c.closeFns, func() { _ = node.Close() })
		addrs = []string{addr}
	}
	opts := coordclient.Options{Logger: c.logger}
	switch {
	case c.devCoordinator != nil:
		// The embedded coordinator is plaintext on loopback.
	case c.tls != nil:
		src := c.tls
		if id := tlsfiles.Names(src.Leaf(), tlsfiles.RoleAgent); !slices.Contains(id, cfg.AgentID) {
			// The coordinators would refuse every renewal: say so now.
			c.logger.Error("the "+c.opts.name("-tls-cert")+" does not name this agent: the coordinators will refuse its leases",
				"agent_id", cfg.AgentID, "want_uri_san", tlsfiles.URI(tlsfiles.RoleAgent, cfg.AgentID), "cert_agents", id)
		}
		// Only a coordinator of this agent's group is its coordinator: its
		// region's group, or the global group where no regional one runs.
		// Another certificate of the CA (an agent's, another region's
		// coordinator) could otherwise grant this agent any lease, or
		// serve it from another region's budget.
		opts.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(src.ClientCredentials("", tlsfiles.RequireCoordinator(tlsfiles.GlobalGroup, cfg.Region)))}
	default: // -insecure or -dev: CheckCore refuses plaintext without either
		c.logger.Warn("PLAINTEXT to the coordinators by "+c.opts.name("-insecure")+" or -dev: anyone on the path can read and alter lease traffic", "coordinators", cfg.Coordinators)
	}
	client := coordclient.New(addrs, opts)
	c.closeFns = append(c.closeFns, func() { _ = client.Close() })
	h, err := holder.New(holder.Options{
		Client: client, Holder: cfg.AgentID, Region: cfg.Region,
		ColdStart: cfg.FirstGrant(), Logger: c.logger, Registry: c.opts.Registry,
		Rules: func() *rules.Set {
			if c.rules == nil {
				return nil
			}
			return c.rules.Current()
		},
	})
	if err != nil {
		return nil, err
	}
	c.holder = h
	return h, nil
}
