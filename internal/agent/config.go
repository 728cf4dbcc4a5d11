package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/ration-dev/ration/internal/breaker"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/envflag"
	"github.com/ration-dev/ration/internal/logformat"
	"github.com/ration-dev/ration/internal/rules"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

// Config is everything the gateway-agent process needs. Layers, in order:
// DefaultConfig (or DevConfig under -dev), environment (RATION_*), flags;
// then one Validate pass that reports every problem.
type Config struct {
	RulesFile       string        // -rules, RATION_RULES
	Coordinators    string        // -coordinators, RATION_COORDINATORS: comma list of coordinator gRPC addresses
	Redis           string        // -redis, RATION_REDIS
	HTTPAddr        string        // -http, RATION_HTTP
	GRPCAddr        string        // -grpc, RATION_GRPC
	Region          string        // -region, RATION_REGION
	AgentID         string        // -id, RATION_AGENT_ID
	DecisionTimeout time.Duration // -decision-timeout, RATION_DECISION_TIMEOUT
	// FirstGrantTimeout bounds how long the first decision of a leased
	// quota the agent does not hold yet (a new subject) waits for its
	// first grant. It is not the decision timeout: a grant is a
	// coordinator round trip (a Raft commit), which takes longer than a
	// Redis call, and a request that loses that race would get its rule's
	// failure policy on a healthy group.
	FirstGrantTimeout time.Duration // -first-grant-timeout, RATION_FIRST_GRANT_TIMEOUT
	ReloadInterval    time.Duration // -reload-interval, RATION_RELOAD_INTERVAL
	Breaker           breaker.Config
	ShutdownTimeout   time.Duration // -shutdown-timeout, RATION_SHUTDOWN_TIMEOUT
	StallTimeout      time.Duration // -stall-timeout, RATION_STALL_TIMEOUT: 0 is StallLimit's default
	LogLevel          string        // -log-level, RATION_LOG_LEVEL
	LogFormat         string        // -log-format, RATION_LOG_FORMAT: text or json
	Record            string        // -record, RATION_RECORD: admission log file (off when empty)
	Dev               bool          // -dev: in-memory store, embedded sample rules
	Validate          bool          // -validate: check the rules file and exit
	// TLS is the agent's certificate (URI SAN ration://agent/<-id>), key
	// and CA bundle: mutual TLS to the coordinators, which bind the lease
	// holder -id to it. Reloaded when the files change.
	TLS tlsfiles.Files // -tls-cert, -tls-key, -tls-ca
	// Insecure talks to the coordinators in plaintext by choice. Without
	// TLS files and without it (or -dev), the agent warns at start-up.
	Insecure bool // -insecure, RATION_INSECURE
	// TLSReloadInterval: how often the TLS files are checked (0: the
	// default). Not a flag: tests shorten it.
	TLSReloadInterval time.Duration
	// ListenTLS serves the agent's own gRPC and HTTP listeners over TLS
	// with the -tls-cert certificate; ListenClientAuth also requires the
	// gateway's client certificate (ration://gateway/<name>), chaining to
	// -tls-ca.
	ListenTLS        bool // -listen-tls, RATION_LISTEN_TLS
	ListenClientAuth bool // -listen-client-auth, RATION_LISTEN_CLIENT_AUTH
	// MetricsAddr, when set, serves /metrics, /healthz and /readyz on a
	// plaintext listener of their own, and /metrics no longer on -http (so
	// Prometheus and probes need no client certificate).
	MetricsAddr string // -metrics, RATION_METRICS
	// GRPCWorkers is how many goroutines serve gRPC calls, each call after
	// call; 0: a new goroutine per call (gRPC's default). A new goroutine
	// grows its stack again for every call (runtime.morestack), 8.6% of
	// the agent's CPU in a unary load.
	GRPCWorkers int // -grpc-workers, RATION_GRPC_WORKERS
	// LocalDenials is how many buckets' store denials the agent remembers
	// (Options.LocalDenials); 0: off.
	LocalDenials int // -local-denials, RATION_LOCAL_DENIALS
	// RedisTLS verifies and authenticates a rediss:// -redis (CA, client
	// certificate, server name).
	RedisTLS bucket.RedisTLS // -redis-tls-ca, -redis-tls-cert, -redis-tls-key, -redis-tls-server-name
	// RLQS tunes the Rate Limit Quota Service served to Envoy
	// (internal/rlqs): -rlqs-delta, -rlqs-max-ttl, -rlqs-take-ttl,
	// -rlqs-grace, -rlqs-max-streams, -rlqs-max-buckets.
	RLQS RLQSConfig

	// DevCoordinator starts the single-node coordinator that -dev embeds
	// when -coordinators is empty. It is not a flag: cmd/gateway-agent
	// sets it, so that this package links no Raft and no BoltDB. Nil under
	// -dev: no coordinator, and leased rules decide by their failure
	// policy.
	DevCoordinator StartDevCoordinator
}

// StartDevCoordinator starts an embedded coordinator serving set and
// returns it with its gRPC address; it returns once the coordinator leads.
type StartDevCoordinator func(ctx context.Context, logger *slog.Logger, set *rules.Set) (DevCoordinator, string, error)

// DevCoordinator is a running embedded coordinator: it follows the
// agent's rules reloads and stops with the agent.
type DevCoordinator interface {
	SetRules(*rules.Set)
	Close() error
}

// RLQSConfig is what an operator may tune of RLQS (rlqs.Options).
type RLQSConfig struct {
	// Delta bounds the delivery of a message between the agent and
	// Envoy plus the lateness of Envoy's timers: the bound assumes it.
	Delta   time.Duration
	MaxTTL  time.Duration // longest assignment TTL, whole seconds
	TakeTTL time.Duration // TTL of an assignment funded by a take, whole seconds
	Grace   time.Duration // how long a report closing an assignment is awaited
	// MaxStreams and MaxBuckets bound the streams of the agent and the
	// buckets of one stream.
	MaxStreams, MaxBuckets int
	// MaxClientStreams bounds the streams one connection holds open;
	// Silent ends a stream that reports nothing for that long
	// (rlqs.Options).
	MaxClientStreams int
	Silent           time.Duration
	// NoCarry charges every token bucket assignment its whole
	// max_tokens, unchanged ones too: for Envoys that start a new bucket
	// on every assignment (rlqs.Options.NoCarry).
	NoCarry bool
}

// Bounds on RLQSConfig.
const (
	MaxRLQSDelta   = 5 * time.Second
	MaxRLQSTTL     = time.Minute
	MaxRLQSGrace   = time.Minute
	MaxRLQSStreams = 1 << 16
	MaxRLQSBuckets = 1 << 20
	MaxRLQSSilent  = time.Hour
)

// check reports what is out of bounds; a zero field is rlqs.Options'
// default (a Config built without DefaultConfig).
func (r RLQSConfig) check() []error {
	var errs []error
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&r.Delta, 200*time.Millisecond)
	def(&r.MaxTTL, 5*time.Second)
	def(&r.TakeTTL, min(2*time.Second, r.MaxTTL))
	def(&r.Grace, max(3*time.Second, r.Delta))
	if r.MaxStreams == 0 {
		r.MaxStreams = 256
	}
	if r.MaxBuckets == 0 {
		r.MaxBuckets = 1000
	}
	if r.MaxClientStreams == 0 {
		r.MaxClientStreams = 8
	}
	def(&r.Silent, time.Minute)
	if r.Delta <= 0 || r.Delta > MaxRLQSDelta {
		errs = append(errs, fmt.Errorf("-rlqs-delta %v: must be in (0, %v]", r.Delta, MaxRLQSDelta))
	}
	whole := func(flag string, d, most time.Duration) {
		if d < time.Second || d > most || d%time.Second != 0 {
			errs = append(errs, fmt.Errorf("%s %v: must be whole seconds in [1s, %v] (Envoy reads the seconds of a TTL only)", flag, d, most))
		}
	}
	whole("-rlqs-max-ttl", r.MaxTTL, MaxRLQSTTL)
	whole("-rlqs-take-ttl", r.TakeTTL, r.MaxTTL)
	if r.Grace < r.Delta || r.Grace > MaxRLQSGrace {
		errs = append(errs, fmt.Errorf("-rlqs-grace %v: must be in [-rlqs-delta %v, %v]", r.Grace, r.Delta, MaxRLQSGrace))
	}
	if r.MaxStreams < 1 || r.MaxStreams > MaxRLQSStreams {
		errs = append(errs, fmt.Errorf("-rlqs-max-streams %d: must be in [1, %d]", r.MaxStreams, MaxRLQSStreams))
	}
	if r.MaxBuckets < 1 || r.MaxBuckets > MaxRLQSBuckets {
		errs = append(errs, fmt.Errorf("-rlqs-max-buckets %d: must be in [1, %d]", r.MaxBuckets, MaxRLQSBuckets))
	}
	if r.MaxClientStreams < 1 || r.MaxClientStreams > MaxRLQSStreams {
		errs = append(errs, fmt.Errorf("-rlqs-max-client-streams %d: must be in [1, %d]", r.MaxClientStreams, MaxRLQSStreams))
	}
	if r.Silent < 5*time.Second || r.Silent > MaxRLQSSilent {
		errs = append(errs, fmt.Errorf("-rlqs-silent %v: must be in [5s, %v]", r.Silent, MaxRLQSSilent))
	}
	return errs
}

// DefaultConfig is the production starting point.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		HTTPAddr:        "127.0.0.1:8080",
		GRPCAddr:        "127.0.0.1:8081",
		Region:          "local",
		AgentID:         host,
		DecisionTimeout: 50 * time.Millisecond,
		// A grant is a Raft commit at the leader: about 1-130 ms on a
		// healthy group (the -dev pair measured 64-128 ms); a second
		// covers a leader election's tail too, and a caller's own deadline
		// (Envoy's 20 ms) still cuts it short.
		FirstGrantTimeout: DefaultFirstGrantTimeout,
		GRPCWorkers:       DefaultGRPCWorkers,
		LocalDenials:      DefaultLocalDenials,
		ReloadInterval:    time.Second,
		Breaker:           breaker.DefaultConfig(),
		ShutdownTimeout:   10 * time.Second,
		LogLevel:          "info",
		LogFormat:         "text",
		RLQS: RLQSConfig{Delta: 200 * time.Millisecond, MaxTTL: 5 * time.Second, TakeTTL: 2 * time.Second,
			Grace: 3 * time.Second, MaxStreams: 256, MaxBuckets: 1000, MaxClientStreams: 8, Silent: time.Minute},
	}
}

// FirstGrant is -first-grant-timeout, its default when unset (0).
func (c Config) FirstGrant() time.Duration {
	if c.FirstGrantTimeout <= 0 {
		return DefaultFirstGrantTimeout
	}
	return c.FirstGrantTimeout
}

// StallLimit is how long a decision may be in flight, or the lease loop go
// without a step, before the agent calls itself wedged: -stall-timeout, or
// by default longer than any healthy decision takes (each of its waits is
// bounded by the decision timeout, a first grant's by -first-grant-timeout)
// and than a renewal call (2s).
func (c Config) StallLimit() time.Duration {
	if c.StallTimeout > 0 {
		return c.StallTimeout
	}
	return 5*time.Second + 4*c.DecisionTimeout + c.FirstGrant()
}

// DevConfig is DefaultConfig for a first try: in-memory store and the
// embedded sample rules unless -rules names a file.
func DevConfig() Config {
	c := DefaultConfig()
	c.Dev = true
	c.LogLevel = "info"
	return c
}

// DefaultFirstGrantTimeout is -first-grant-timeout's default.
const DefaultFirstGrantTimeout = time.Second

// envPrefix is the prefix of every environment variable the agent reads.
const envPrefix = "RATION_"

// The gRPC worker pool (-grpc-workers). 64 covers the calls a gateway's
// connection pool keeps in flight (a unary call waits on Redis, so more
// workers than cores are busy at once); each idle worker is a parked
// goroutine and its stack.
const (
	DefaultGRPCWorkers = 64
	MaxGRPCWorkers     = 4096
)

// settings is the one table of the agent's flags and RATION_* variables.
func (c *Config) settings() []envflag.Setting {
	return []envflag.Setting{
		{Flag: "rules", Env: "RULES", Usage: "rules YAML file (required unless -dev); reloaded when its content changes and on SIGHUP", Value: &c.RulesFile},
		{Flag: "coordinators", Env: "COORDINATORS", Usage: "coordinator gRPC addresses, comma separated (any members of the region's group; the agent finds the leader), for mode: leased rules; under -dev without it a single-node coordinator is embedded", Value: &c.Coordinators},
		{Flag: "redis", Env: "REDIS", Usage: "the region's Redis (required unless -dev, or unless every rule is mode: leased): host:port, redis://[user:pass@]host:port[/db], redis-sentinel://[user:pass@]h:p[,h:p]/master[?sentinel_username=U&sentinel_password=P], redis-cluster://h:p[,h:p]; rediss://, rediss-sentinel://, rediss-cluster:// for TLS", Value: &c.Redis, Redact: bucket.RedactRedisSpec},
		{Flag: "listen-tls", Env: "LISTEN_TLS", Usage: "serve the -grpc and -http listeners over TLS with the -tls-cert certificate (reloaded when it changes)", Value: &c.ListenTLS},
		{Flag: "listen-client-auth", Env: "LISTEN_CLIENT_AUTH", Usage: "with -listen-tls, require clients of -grpc and -http to present a gateway's certificate (URI SAN ration://gateway/<name>) chaining to -tls-ca", Value: &c.ListenClientAuth},
		{Flag: "metrics", Env: "METRICS", Usage: "plaintext listen address for /metrics, /healthz and /readyz on their own (then /metrics is not on -http); empty: all on -http", Value: &c.MetricsAddr},
		{Flag: "redis-tls-ca", Env: "REDIS_TLS_CA", Usage: "PEM CA bundle a rediss:// server's certificate must chain to (default: the system's roots)", Value: &c.RedisTLS.CA},
		{Flag: "redis-tls-cert", Env: "REDIS_TLS_CERT", Usage: "PEM client certificate for a rediss:// server that requires one (tls-auth-clients yes)", Value: &c.RedisTLS.Cert},
		{Flag: "redis-tls-key", Env: "REDIS_TLS_KEY", Usage: "PEM private key of -redis-tls-cert", Value: &c.RedisTLS.Key},
		{Flag: "redis-tls-server-name", Env: "REDIS_TLS_SERVER_NAME", Usage: "name every rediss:// server's certificate must carry (Sentinels, primaries and Cluster nodes alike), instead of the host or IP address dialled: for Sentinel and Cluster, which hand out servers by IP address, when their certificates name a host", Value: &c.RedisTLS.ServerName},
		{Flag: "http", Env: "HTTP", Usage: "HTTP listen address (/v1/allow, /v1/check, /metrics, /healthz, /readyz)", Value: &c.HTTPAddr},
		{Flag: "grpc", Env: "GRPC", Usage: "gRPC listen address (ration.v1.RateLimiter, Envoy's rate-limit service, grpc.health.v1)", Value: &c.GRPCAddr},
		{Flag: "grpc-workers", Env: "GRPC_WORKERS", Usage: "goroutines that serve gRPC calls one after another (calls beyond them get one each); 0: one goroutine per call", Value: &c.GRPCWorkers},
		{Flag: "region", Env: "REGION", Usage: "region name this agent runs in; picks its share of scope: global rules", Value: &c.Region},
		{Flag: "id", Env: "AGENT_ID", Usage: "agent id, unique per agent: two agents must never share one (default: host name)", Value: &c.AgentID},
		{Flag: "decision-timeout", Env: "DECISION_TIMEOUT", Usage: "longest a decision waits on the store before the rule's failure policy applies, at most 10s", Value: &c.DecisionTimeout},
		{Flag: "first-grant-timeout", Env: "FIRST_GRANT_TIMEOUT", Usage: "longest the first decision of a leased quota this agent does not hold yet (a new subject of a \"*\" rule) waits for the coordinators' first grant before the rule's failure policy applies, at most 10s; later decisions of the quota never wait (docs/leases.md)", Value: &c.FirstGrantTimeout},
		{Flag: "local-denials", Env: "LOCAL_DENIALS", Usage: "how many buckets' denials by the store the agent remembers, to deny a subject's further requests itself while the denial is certain (until the refill could pay for them; docs/failure-policies.md); at most 1048576; 0: every decision goes to the store", Value: &c.LocalDenials},
		{Flag: "rlqs-delta", Env: "RLQS_DELTA", Usage: "RLQS: the longest delivery of a message between this agent and Envoy plus the lateness of Envoy's timers, which the bound assumes (docs/integrations/envoy-rlqs.md); assignments and their reservations last this much longer, at most 5s", Value: &c.RLQS.Delta},
		{Flag: "rlqs-max-ttl", Env: "RLQS_MAX_TTL", Usage: "RLQS: longest assignment TTL, whole seconds, at most 1m (a lent one also ends before its lease's validity)", Value: &c.RLQS.MaxTTL},
		{Flag: "rlqs-take-ttl", Env: "RLQS_TAKE_TTL", Usage: "RLQS: TTL of an assignment funded by a take (mode redis, auto, default-share rules), whole seconds, at most -rlqs-max-ttl: each take pays for and holds its whole TTL", Value: &c.RLQS.TakeTTL},
		{Flag: "rlqs-grace", Env: "RLQS_GRACE", Usage: "RLQS: how long after an assignment is over a report that settles it is awaited before what it reserved is forfeit, at least -rlqs-delta, at most 1m", Value: &c.RLQS.Grace},
		{Flag: "rlqs-no-carry", Env: "RLQS_NO_CARRY", Usage: "RLQS: charge every token bucket assignment its whole max_tokens, unchanged ones too; only for Envoys that start a new, full bucket on every assignment (Envoy's filter carries an unchanged one on; docs/integrations/envoy-rlqs.md)", Value: &c.RLQS.NoCarry},
		{Flag: "rlqs-max-streams", Env: "RLQS_MAX_STREAMS", Usage: "RLQS: most streams open at once (more are refused), at most 65536", Value: &c.RLQS.MaxStreams},
		{Flag: "rlqs-max-client-streams", Env: "RLQS_MAX_CLIENT_STREAMS", Usage: "RLQS: most streams one connection holds open at once (Envoy keeps one), at most 65536 (and -rlqs-max-streams)", Value: &c.RLQS.MaxClientStreams},
		{Flag: "rlqs-silent", Env: "RLQS_SILENT", Usage: "RLQS: a stream that reports nothing for this long is ended (its first report is due within a tenth of it, at least 5s), 5s to 1h", Value: &c.RLQS.Silent},
		{Flag: "rlqs-max-buckets", Env: "RLQS_MAX_BUCKETS", Usage: "RLQS: most buckets one stream may report (a report naming more ends the stream), at most 1048576", Value: &c.RLQS.MaxBuckets},
		{Flag: "reload-interval", Env: "RELOAD_INTERVAL", Usage: "how often the rules file is checked for changes", Value: &c.ReloadInterval},
		{Flag: "breaker-threshold", Env: "BREAKER_THRESHOLD", Usage: "consecutive failed store calls (one per decision, or per call of at most 1024 charges of a batch) that open the circuit breaker", Value: &c.Breaker.Threshold},
		{Flag: "breaker-probe-interval", Env: "BREAKER_PROBE_INTERVAL", Usage: "pause between store probes while the breaker is open", Value: &c.Breaker.ProbeInterval},
		{Flag: "shutdown-timeout", Env: "SHUTDOWN_TIMEOUT", Usage: "graceful shutdown limit on SIGTERM and SIGINT; past it the process exits whatever is in flight", Value: &c.ShutdownTimeout},
		{Flag: "stall-timeout", Env: "STALL_TIMEOUT", Usage: "a decision in flight, or a lease renewal loop without a step, for longer than this turns /healthz to 503 (wedged); 0: 5s + 4 x -decision-timeout + -first-grant-timeout", Value: &c.StallTimeout},
		{Flag: "log-level", Env: "LOG_LEVEL", Usage: "debug, info, warn or error", Value: &c.LogLevel},
		{Flag: "log-format", Env: "LOG_FORMAT", Usage: logformat.Usage, Value: &c.LogFormat},
		{Flag: "record", Env: "RECORD", Usage: "append every decision to this admission log (for ration-check and the chaos suite; about 0.3 µs per decision); off when empty", Value: &c.Record},
		{Flag: "tls-cert", Env: "TLS_CERT", Usage: "PEM certificate of this agent (URI SAN ration://agent/<-id>), for mutual TLS to the coordinators; reloaded when it changes", Value: &c.TLS.Cert},
		{Flag: "tls-key", Env: "TLS_KEY", Usage: "PEM private key of -tls-cert", Value: &c.TLS.Key},
		{Flag: "tls-ca", Env: "TLS_CA", Usage: "PEM CA bundle the coordinators' certificates must chain to", Value: &c.TLS.CA},
		{Flag: "insecure", Env: "INSECURE", Usage: "talk to the coordinators in plaintext, unauthenticated, by choice (-dev implies it); with -coordinators and without TLS files the agent refuses to start unless it is set", Value: &c.Insecure},
		{Flag: "dev", Env: "DEV", Usage: "development mode: in-memory store and the sample rules (examples/rules.yaml), no other process needed", Value: &c.Dev},
		{Flag: "validate", Usage: "check the -rules file, print every problem and exit (status 1 if invalid)", Value: &c.Validate},
	}
}

// BindFlags registers every flag on fs, with defaults taken from c (which
// already holds the environment layer). Usage text names the variable.
func (c *Config) BindFlags(fs *flag.FlagSet) { envflag.Bind(fs, envPrefix, c.settings()) }

// LoadEnv applies RATION_* variables from lookup (os.LookupEnv in main).
// Every malformed value is reported.
func (c *Config) LoadEnv(lookup func(string) (string, bool)) error {
	return envflag.Load(envPrefix, c.settings(), lookup)
}

// Check reports every problem with the configuration at once: CheckCore's
// and the process's own (listeners, logging, shutdown).
func (c Config) Check() error {
	var errs []error
	if c.Validate {
		if c.RulesFile == "" {
			errs = append(errs, errors.New("-validate needs -rules FILE"))
		}
		return errors.Join(errs...)
	}
	errs = append(errs, c.CheckCore())
	for _, a := range []struct{ flag, addr string }{{"-http", c.HTTPAddr}, {"-grpc", c.GRPCAddr}} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", a.flag, a.addr, err))
		}
	}
	if c.HTTPAddr == c.GRPCAddr && !strings.HasSuffix(c.HTTPAddr, ":0") {
		errs = append(errs, fmt.Errorf("-http and -grpc are both %q", c.HTTPAddr))
	}
	if c.GRPCWorkers < 0 || c.GRPCWorkers > MaxGRPCWorkers {
		errs = append(errs, fmt.Errorf("-grpc-workers %d: must be in [0, %d]", c.GRPCWorkers, MaxGRPCWorkers))
	}
	if c.LocalDenials < 0 || c.LocalDenials > MaxLocalDenials {
		errs = append(errs, fmt.Errorf("-local-denials %d: must be in [0, %d]", c.LocalDenials, MaxLocalDenials))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("-shutdown-timeout %v: must be positive", c.ShutdownTimeout))
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("-log-level %q: want debug, info, warn or error", c.LogLevel))
	}
	if c.ListenTLS && !c.TLS.Enabled() {
		errs = append(errs, errors.New("-listen-tls needs -tls-cert, -tls-key and -tls-ca"))
	}
	if c.ListenClientAuth && !c.ListenTLS {
		errs = append(errs, errors.New("-listen-client-auth needs -listen-tls"))
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			errs = append(errs, fmt.Errorf("-metrics %q: %w", c.MetricsAddr, err))
		}
	}
	if _, err := logformat.Parse(c.LogFormat); err != nil {
		errs = append(errs, fmt.Errorf("-log-format %q: %w", c.LogFormat, err))
	}
	return errors.Join(errs...)
}

// CheckCore reports every problem with what the decision side (NewCore)
// reads: rules, coordinators, timeouts, breaker, id and TLS files. The
// embedded limiter checks its own Config's fields first, so these
// messages name the sidecar's flags.
func (c Config) CheckCore() error {
	var errs []error
	// -redis may be empty when every rule is mode: leased, which only the
	// rules tell: NewCore checks it.
	if !c.Dev && c.RulesFile == "" {
		errs = append(errs, errors.New("-rules: a rules file is required (or run with -dev)"))
	}
	for _, a := range c.CoordinatorAddrs() {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("-coordinators: %q: %w", a, err))
		}
	}
	if c.DecisionTimeout <= 0 || c.DecisionTimeout > 10*time.Second {
		errs = append(errs, fmt.Errorf("-decision-timeout %v: must be in (0, 10s]", c.DecisionTimeout))
	}
	if c.FirstGrantTimeout < 0 || c.FirstGrantTimeout > 10*time.Second {
		errs = append(errs, fmt.Errorf("-first-grant-timeout %v: must be in [0, 10s] (0: %v)", c.FirstGrantTimeout, DefaultFirstGrantTimeout))
	}
	if c.ReloadInterval <= 0 {
		errs = append(errs, fmt.Errorf("-reload-interval %v: must be positive", c.ReloadInterval))
	}
	errs = append(errs, c.RLQS.check()...)
	if c.StallTimeout != 0 && c.StallTimeout < time.Second {
		errs = append(errs, fmt.Errorf("-stall-timeout %v: must be 0 (the default) or at least 1s", c.StallTimeout))
	}
	if err := c.Breaker.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.AgentID == "" {
		errs = append(errs, errors.New("-id: agent id is empty (and the host name could not be read)"))
	}
	if err := c.TLS.Check(); err != nil {
		errs = append(errs, err)
	}
	if len(c.CoordinatorAddrs()) > 0 && !c.TLS.Enabled() && !c.Insecure && !c.Dev {
		// Lease traffic carries the bound: a grant rewritten on the path is
		// an overshoot, so plaintext to the coordinators is only by choice.
		errs = append(errs, fmt.Errorf("-coordinators %q without TLS: set -tls-cert, -tls-key and -tls-ca (docs/security.md), or -insecure to talk to the coordinators in plaintext", c.Coordinators))
	}
	if c.TLS.Enabled() && c.Insecure {
		errs = append(errs, errors.New("-insecure and -tls-cert/-tls-key/-tls-ca: choose plaintext or TLS"))
	}
	return errors.Join(errs...)
}

// CoordinatorAddrs splits -coordinators.
func (c Config) CoordinatorAddrs() []string {
	var out []string
	for _, a := range strings.Split(c.Coordinators, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}
