package agent

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ration-dev/ration/internal/breaker"
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
	ReloadInterval  time.Duration // -reload-interval, RATION_RELOAD_INTERVAL
	Breaker         breaker.Config
	ShutdownTimeout time.Duration // -shutdown-timeout, RATION_SHUTDOWN_TIMEOUT
	LogLevel        string        // -log-level, RATION_LOG_LEVEL
	Record          string        // -record, RATION_RECORD: admission log file (off when empty)
	Dev             bool          // -dev: in-memory store, embedded sample rules
	Validate        bool          // -validate: check the rules file and exit
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
		ReloadInterval:  time.Second,
		Breaker:         breaker.DefaultConfig(),
		ShutdownTimeout: 10 * time.Second,
		LogLevel:        "info",
	}
}

// DevConfig is DefaultConfig for a first try: in-memory store and the
// embedded sample rules unless -rules names a file.
func DevConfig() Config {
	c := DefaultConfig()
	c.Dev = true
	c.LogLevel = "info"
	return c
}

// envPrefix is the prefix of every environment variable the agent reads.
const envPrefix = "RATION_"

// BindFlags registers every flag on fs, with defaults taken from c (which
// already holds the environment layer). Usage text names the variable.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	str := func(p *string, name, env, usage string) {
		fs.StringVar(p, name, *p, fmt.Sprintf("%s (env %s%s)", usage, envPrefix, env))
	}
	dur := func(p *time.Duration, name, env, usage string) {
		fs.DurationVar(p, name, *p, fmt.Sprintf("%s (env %s%s)", usage, envPrefix, env))
	}
	str(&c.RulesFile, "rules", "RULES", "rules YAML file; reloaded on change and on SIGHUP")
	str(&c.Coordinators, "coordinators", "COORDINATORS", "coordinator gRPC addresses, comma separated (any members of the region's group), for mode: leased rules")
	str(&c.Redis, "redis", "REDIS", "Redis: host:port, redis://[user:pass@]host:port[/db], redis-sentinel://h:p[,h:p]/master, redis-cluster://h:p[,h:p]")
	str(&c.HTTPAddr, "http", "HTTP", "HTTP listen address (/v1/allow, /v1/check, /metrics, /healthz, /readyz)")
	str(&c.GRPCAddr, "grpc", "GRPC", "gRPC listen address (ration.v1.RateLimiter)")
	str(&c.Region, "region", "REGION", "region name this agent runs in")
	str(&c.AgentID, "id", "AGENT_ID", "agent id, unique per agent (default: host name)")
	dur(&c.DecisionTimeout, "decision-timeout", "DECISION_TIMEOUT", "longest a decision waits on the store before the rule's failure policy applies")
	dur(&c.ReloadInterval, "reload-interval", "RELOAD_INTERVAL", "how often the rules file is checked for changes")
	fs.IntVar(&c.Breaker.Threshold, "breaker-threshold", c.Breaker.Threshold, "consecutive store failures that open the circuit breaker (env RATION_BREAKER_THRESHOLD)")
	dur(&c.Breaker.ProbeInterval, "breaker-probe-interval", "BREAKER_PROBE_INTERVAL", "pause between store probes while the breaker is open")
	dur(&c.ShutdownTimeout, "shutdown-timeout", "SHUTDOWN_TIMEOUT", "graceful shutdown limit")
	str(&c.LogLevel, "log-level", "LOG_LEVEL", "debug, info, warn or error")
	str(&c.Record, "record", "RECORD", "append every decision to this admission log (for cmd/ration-check); off when empty")
	fs.BoolVar(&c.Dev, "dev", c.Dev, "development mode: in-memory store and sample rules, no other process needed")
	fs.BoolVar(&c.Validate, "validate", c.Validate, "check the -rules file, print every problem and exit (non-zero if invalid)")
}

// LoadEnv applies RATION_* variables from lookup (os.LookupEnv in main).
// Every malformed value is reported.
func (c *Config) LoadEnv(lookup func(string) (string, bool)) error {
	var errs []error
	str := func(p *string, env string) {
		if v, ok := lookup(envPrefix + env); ok {
			*p = v
		}
	}
	dur := func(p *time.Duration, env string) {
		if v, ok := lookup(envPrefix + env); ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s%s=%q: %w", envPrefix, env, v, err))
				return
			}
			*p = d
		}
	}
	boolean := func(p *bool, env string) {
		if v, ok := lookup(envPrefix + env); ok {
			b, err := strconv.ParseBool(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s%s=%q: not a boolean", envPrefix, env, v))
				return
			}
			*p = b
		}
	}
	str(&c.RulesFile, "RULES")
	str(&c.Redis, "REDIS")
	str(&c.Coordinators, "COORDINATORS")
	str(&c.HTTPAddr, "HTTP")
	str(&c.GRPCAddr, "GRPC")
	str(&c.Region, "REGION")
	str(&c.AgentID, "AGENT_ID")
	dur(&c.DecisionTimeout, "DECISION_TIMEOUT")
	dur(&c.ReloadInterval, "RELOAD_INTERVAL")
	dur(&c.Breaker.ProbeInterval, "BREAKER_PROBE_INTERVAL")
	dur(&c.ShutdownTimeout, "SHUTDOWN_TIMEOUT")
	str(&c.LogLevel, "LOG_LEVEL")
	str(&c.Record, "RECORD")
	boolean(&c.Dev, "DEV")
	if v, ok := lookup(envPrefix + "BREAKER_THRESHOLD"); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%sBREAKER_THRESHOLD=%q: not an integer", envPrefix, v))
		} else {
			c.Breaker.Threshold = n
		}
	}
	return errors.Join(errs...)
}

// Check reports every problem with the configuration at once.
func (c Config) Check() error {
	var errs []error
	if c.Validate {
		if c.RulesFile == "" {
			errs = append(errs, errors.New("-validate needs -rules FILE"))
		}
		return errors.Join(errs...)
	}
	if !c.Dev {
		if c.RulesFile == "" {
			errs = append(errs, errors.New("-rules: a rules file is required (or run with -dev)"))
		}
		if c.Redis == "" {
			errs = append(errs, errors.New("-redis: a Redis address is required (or run with -dev for an in-memory store)"))
		}
	}
	for _, a := range []struct{ flag, addr string }{{"-http", c.HTTPAddr}, {"-grpc", c.GRPCAddr}} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", a.flag, a.addr, err))
		}
	}
	for _, a := range c.CoordinatorAddrs() {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("-coordinators: %q: %w", a, err))
		}
	}
	if c.HTTPAddr == c.GRPCAddr && !strings.HasSuffix(c.HTTPAddr, ":0") {
		errs = append(errs, fmt.Errorf("-http and -grpc are both %q", c.HTTPAddr))
	}
	if c.DecisionTimeout <= 0 || c.DecisionTimeout > 10*time.Second {
		errs = append(errs, fmt.Errorf("-decision-timeout %v: must be in (0, 10s]", c.DecisionTimeout))
	}
	if c.ReloadInterval <= 0 {
		errs = append(errs, fmt.Errorf("-reload-interval %v: must be positive", c.ReloadInterval))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("-shutdown-timeout %v: must be positive", c.ShutdownTimeout))
	}
	if err := c.Breaker.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.AgentID == "" {
		errs = append(errs, errors.New("-id: agent id is empty (and the host name could not be read)"))
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("-log-level %q: want debug, info, warn or error", c.LogLevel))
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
