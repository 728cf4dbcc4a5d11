// Package limiter runs Ration's decisions inside a Go process: the
// gateway-agent sidecar's decision logic, without the sidecar or its hop.
//
// A Limiter reads the same rules file as the sidecar (reloaded when it
// changes), decides mode: redis rules with one pipelined round trip to the
// region's Redis, spends mode: leased budget in memory from leases it holds
// from the coordinator group, and applies each rule's failure policy
// (fail_open, fail_closed, emergency) when a dependency is down, with the
// same bounds: it is built by the same code as the sidecar
// (internal/agent.NewCore), and each Limiter is one lease holder, as each
// sidecar is.
//
//	l, err := limiter.New(ctx, limiter.Config{
//		RulesFile:    "rules.yaml",
//		Redis:        "10.0.0.5:6379",
//		Coordinators: []string{"10.0.0.1:8301", "10.0.0.2:8301", "10.0.0.3:8301"},
//		AgentID:      "gw-1",
//		TLSCert:      "gw-1.crt", TLSKey: "gw-1.key", TLSCA: "ca.crt",
//	})
//	...
//	defer l.Close()
//	d, err := l.Allow(ctx, limiter.Request{Descriptors: map[string]string{"tenant": tenant}})
//
// A rule and subject decided over and over (a hot tenant, a global quota)
// can be checked once with Key; its Allow decides a mode: leased rule on a
// valid lease in under 100 ns, and anything else as Limiter.Allow does.
//
// docs/integrations/go.md says when to embed and when to run the sidecar.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/breaker"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

// Errors callers branch on, with errors.Is.
var (
	// ErrConfig: New was given a Config it cannot run (a missing or
	// invalid rules file, a bad address, rules that need a Redis or
	// coordinators the Config does not give...). The error names the
	// field or the file's line; nothing was started.
	ErrConfig = errors.New("limiter: bad config")
	// ErrInvalidRequest: the request can never be decided as sent (bad
	// cost, descriptors, rule, subject or request id). No bucket was
	// touched. The same value as the sidecar's.
	ErrInvalidRequest = agent.ErrInvalidRequest
	// ErrUnknownRule: the request names a rule that is not loaded. It
	// comes with ErrInvalidRequest.
	ErrUnknownRule = agent.ErrUnknownRule
	// ErrClosed: Allow after Close.
	ErrClosed = errors.New("limiter: closed")
)

// Defaults of Config's zero fields: the sidecar's.
const (
	DefaultDecisionTimeout = 50 * time.Millisecond
	DefaultReloadInterval  = time.Second
	DefaultRegion          = "local"
)

// Config is what New needs. Its fields are the sidecar's flags
// (docs/configuration.md) under Go names; a zero field takes the sidecar's
// default.
type Config struct {
	// RulesFile is the rules YAML (-rules). Required. It is read again
	// every ReloadInterval; a file that is invalid, or that this Limiter
	// cannot run, leaves the rules in force.
	RulesFile string
	// Redis is the region's Redis (-redis), in any form the sidecar
	// takes: host:port, redis://, redis-sentinel://, redis-cluster://,
	// and rediss... for TLS. Empty only when every rule is mode: leased.
	Redis string
	// RedisTLS verifies and authenticates a rediss:// Redis.
	RedisTLS RedisTLS
	// Coordinators are gRPC addresses (host:port) of the region's
	// coordinator group (-coordinators), for mode: leased and auto rules.
	Coordinators []string
	// TLSCert, TLSKey and TLSCA are PEM files for mutual TLS to the
	// coordinators (-tls-cert, -tls-key, -tls-ca); the certificate names
	// ration://agent/<AgentID>. Reloaded when they change. All three or
	// none.
	TLSCert, TLSKey, TLSCA string
	// Insecure talks to the coordinators in plaintext, by choice
	// (-insecure). Coordinators without TLS files and without Insecure is
	// an error.
	Insecure bool
	// AgentID names this Limiter to the coordinators and in the admission
	// log (-id); unique per process. Default: the host name.
	AgentID string
	// Region is where this process runs (-region): it picks the region's
	// share of scope: global rules. Default "local".
	Region string
	// DecisionTimeout bounds the wait on Redis of one decision
	// (-decision-timeout), at most 10s; past it the rule's failure policy
	// decides. Default 50ms.
	DecisionTimeout time.Duration
	// FirstGrantTimeout bounds a leased quota's first decision's wait for
	// its first grant (-first-grant-timeout), at most 10s; past it the
	// rule's failure policy decides. Default 1s.
	FirstGrantTimeout time.Duration
	// ReloadInterval is how often RulesFile is checked. Default 1s.
	ReloadInterval time.Duration
	// BreakerThreshold consecutive Redis failures stop decisions waiting
	// for Redis until a probe, every BreakerProbeInterval, answers.
	// Defaults 3 and 500ms.
	BreakerThreshold     int
	BreakerProbeInterval time.Duration
	// Registerer receives the sidecar's ration_* metrics (decisions,
	// store errors, breaker, leases...). Nil: not exported. Give each
	// Limiter its own (prometheus.WrapRegistererWith, for one), since the
	// same series cannot be registered twice.
	Registerer prometheus.Registerer
	// Logger receives what the sidecar logs. Nil: discarded.
	Logger *slog.Logger
	// RecordFile, when set, appends every decision to this admission log
	// (-record), for ration-check.
	RecordFile string
}

// RedisTLS is the sidecar's -redis-tls-* flags.
type RedisTLS struct {
	CA        string // PEM CA bundle the servers' certificates chain to (empty: system roots)
	Cert, Key string // PEM client certificate and key (both or neither)
	// ServerName is the name every server's certificate must carry,
	// Sentinels, primaries and Cluster nodes alike (empty: the host dialed,
	// an IP address checked against the certificate's IP SANs).
	ServerName string
}

// Request is one question: may this request proceed? It is the sidecar's
// AllowRequest (docs/api.md).
type Request struct {
	// Descriptors are matched against the rules' match blocks. Give
	// Descriptors, or Rule and Subject, not both.
	Descriptors map[string]string
	Rule        string
	Subject     string
	// Cost in tokens; 0 means 1. Never more than the rule's burst.
	Cost float64
	// RequestID makes retries safe: a repeated id is answered from the
	// record and charges nothing again.
	RequestID string
}

// Decision is the answer.
type Decision struct {
	Allowed bool
	// RetryAfter is when a retry may be admitted; 0 when allowed or when
	// no wait helps.
	RetryAfter time.Duration
	Remaining  float64       // tokens left in the deciding rule's bucket
	Limit      float64       // the deciding rule's burst
	Rate       float64       // the deciding rule's refill rate, tokens per second
	Reset      time.Duration // until the deciding rule's bucket is full
	Rule       string        // the deciding rule ("" when none matched)
	Reason     Reason
}

// Status is the HTTP status the sidecar answers for d: 200 admitted, 429
// quota spent, 503 when Redis or the coordinators are down and the rule
// fails closed (or its emergency allowance is spent or over).
func (d Decision) Status() int {
	return agent.CheckStatus(agent.Response{Allowed: d.Allowed, Reason: agent.Reason(d.Reason)})
}

// Reason says why a decision came out as it did.
type Reason uint8

// The reasons, with the sidecar's values and names (docs/api.md).
const (
	ReasonOK          = Reason(agent.ReasonOK)          // every matching rule admitted
	ReasonOverLimit   = Reason(agent.ReasonOverLimit)   // a rule's quota is spent: 429
	ReasonNoRule      = Reason(agent.ReasonNoRule)      // nothing matched: admitted
	ReasonShadow      = Reason(agent.ReasonShadow)      // a shadow rule would have denied: admitted
	ReasonUnavailable = Reason(agent.ReasonUnavailable) // dependency down: fail_open admitted, or fail_closed (503)
	ReasonEmergency   = Reason(agent.ReasonEmergency)   // decided by the local emergency allowance
)

// String is the reason's name: ok, over_limit, no_rule, shadow,
// unavailable, emergency.
func (r Reason) String() string { return agent.Reason(r).String() }

// Limiter decides requests in process. It is safe for concurrent use.
type Limiter struct {
	core   *agent.Core
	svc    *agent.Service
	closed atomic.Bool
}

// New checks cfg, loads the rules, opens Redis and the coordinator client
// and starts the background work (rules reload, Redis probe, lease
// renewals). A Config it cannot run is an error wrapping ErrConfig, and
// nothing is left running. New does not wait for Redis or for leases:
// until they answer, each rule's failure policy decides (a leased quota's
// first decision waits for its grant at most FirstGrantTimeout). ctx bounds
// New only.
func New(ctx context.Context, cfg Config) (*Limiter, error) {
	acfg, err := cfg.agentConfig()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	reg := &registerer{r: cfg.Registerer}
	if cfg.Registerer == nil {
		reg.r = prometheus.NewRegistry()
	}
	core, err := agent.NewCore(ctx, acfg, agent.CoreOptions{Logger: cfg.Logger, Registry: reg, Name: fieldName})
	if err == nil && reg.err != nil {
		core.Close()
		err = fmt.Errorf("Config.Registerer: %w (give each Limiter its own registry, or wrap it with prometheus.WrapRegistererWith)", reg.err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	core.Run(ctx, nil)
	return &Limiter{core: core, svc: core.Service}, nil
}

// Allow decides one request. A denial is not an error: see
// Decision.Allowed and Status. The error is ErrInvalidRequest (with what
// was wrong) for a request that can never be decided, or ErrClosed.
// A decision waits on Redis, or on a leased quota's first grant, at most
// Config.DecisionTimeout, or until ctx is done if that comes first.
func (l *Limiter) Allow(ctx context.Context, req Request) (Decision, error) {
	if l.closed.Load() {
		return Decision{}, ErrClosed
	}
	r, err := l.svc.Decide(ctx, agent.Request{
		Descriptors: req.Descriptors, Rule: req.Rule, Subject: req.Subject, Cost: req.Cost, RequestID: req.RequestID,
	})
	if err != nil {
		return Decision{}, fmt.Errorf("limiter: %w", err)
	}
	var d Decision
	fill(&d, &r)
	return d, nil
}

// fill makes d the Decision r says, field by field: a composite literal
// is built on the stack and copied in wide moves, which stall on the
// narrow stores just made (a quarter of a leased Key.Allow).
func fill(d *Decision, r *agent.Response) {
	d.Allowed, d.RetryAfter, d.Remaining, d.Limit = r.Allowed, r.RetryAfter, r.Remaining, r.Limit
	d.Rate, d.Reset, d.Rule, d.Reason = r.Rate, r.Reset, r.Rule, Reason(r.Reason)
}

// Key is one rule and subject checked once, for a caller that decides it
// often: a hot tenant, a global quota, the one subject of a service's own
// outbound limit. Key.Allow answers what Allow answers for
// Request{Rule, Subject, Cost}, and a mode: leased rule's decision on a
// valid lease is made without matching, validation or a quota lookup
// (docs/integrations/go.md gives its cost). It is safe for concurrent
// use and follows rules reloads.
type Key struct {
	l *Limiter
	h *agent.Handle
}

// Key checks rule and subject against the rules in force as Allow checks
// Request{Rule: rule, Subject: subject}: the error is ErrInvalidRequest
// (with ErrUnknownRule for a rule not loaded), or ErrClosed. If a reload
// later removes the rule, Key.Allow reports it.
func (l *Limiter) Key(rule, subject string) (*Key, error) {
	if l.closed.Load() {
		return nil, ErrClosed
	}
	h, err := l.svc.Handle(rule, subject)
	if err != nil {
		return nil, fmt.Errorf("limiter: %w", err)
	}
	return &Key{l: l, h: h}, nil
}

// Allow decides cost tokens (0 means 1) of the Key's rule and subject, as
// Limiter.Allow decides them.
func (k *Key) Allow(ctx context.Context, cost float64) (d Decision, err error) {
	if k.l.closed.Load() {
		return Decision{}, ErrClosed
	}
	var r agent.Response
	if err := k.h.Decide(ctx, cost, &r); err != nil {
		return Decision{}, fmt.Errorf("limiter: %w", err)
	}
	fill(&d, &r)
	return d, nil
}

// Ready reports whether the limiter can decide every rule: Redis answered
// and its scripts are loaded (without Redis: at once), the coordinators
// answered and the leases that can be named in advance are held (without
// leased rules: at once). It stays true from then on. Decisions do not
// wait for it; it is for readiness probes.
func (l *Limiter) Ready() bool { return l.core.Ready() }

// Reload reads the rules file now instead of at the next ReloadInterval.
// An invalid file, or rules this Limiter cannot run, keep the rules in
// force and are the error.
func (l *Limiter) Reload() error { return l.core.Reload() }

// Close stops the background work, returns the unused budget of every
// lease to the coordinators (waiting at most the holder's request timeout,
// 2s), and closes the connections and the admission log. Allow then
// answers ErrClosed. A decision in flight when Close is called is decided
// by its rule's failure policy if its store is gone. Close may be called
// more than once.
func (l *Limiter) Close() {
	l.closed.Store(true)
	l.core.Close()
}

// fieldName names Config's fields in the errors of the shared code, which
// otherwise names the sidecar's flags.
func fieldName(flag string) string {
	switch flag {
	case "-redis":
		return "Config.Redis"
	case "-coordinators":
		return "Config.Coordinators"
	case "-region":
		return "Config.Region"
	case "-tls-cert":
		return "Config.TLSCert"
	case "-insecure":
		return "Config.Insecure"
	}
	return flag
}

// agentConfig checks cfg, naming its fields, and makes the sidecar's
// Config of it.
func (cfg Config) agentConfig() (agent.Config, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if cfg.RulesFile == "" {
		bad("Config.RulesFile is empty: a rules file is required")
	}
	for _, a := range cfg.Coordinators {
		if _, _, err := net.SplitHostPort(a); err != nil || strings.Contains(a, ",") {
			bad("Config.Coordinators: %q is not host:port", a)
		}
	}
	if cfg.DecisionTimeout < 0 || cfg.DecisionTimeout > 10*time.Second {
		bad("Config.DecisionTimeout %v: must be in (0, 10s] (0: %v)", cfg.DecisionTimeout, DefaultDecisionTimeout)
	}
	if cfg.FirstGrantTimeout < 0 || cfg.FirstGrantTimeout > 10*time.Second {
		bad("Config.FirstGrantTimeout %v: must be in (0, 10s] (0: 1s)", cfg.FirstGrantTimeout)
	}
	if cfg.ReloadInterval < 0 {
		bad("Config.ReloadInterval %v: must be positive (0: %v)", cfg.ReloadInterval, DefaultReloadInterval)
	}
	if cfg.BreakerThreshold < 0 {
		bad("Config.BreakerThreshold %d: must be at least 1 (0: 3)", cfg.BreakerThreshold)
	}
	if cfg.BreakerProbeInterval < 0 {
		bad("Config.BreakerProbeInterval %v: must be positive (0: 500ms)", cfg.BreakerProbeInterval)
	}
	files := tlsfiles.Files{Cert: cfg.TLSCert, Key: cfg.TLSKey, CA: cfg.TLSCA}
	if files.Enabled() && (cfg.TLSCert == "" || cfg.TLSKey == "" || cfg.TLSCA == "") {
		bad("Config.TLSCert, TLSKey and TLSCA: give all three or none")
	}
	if len(cfg.Coordinators) > 0 && !files.Enabled() && !cfg.Insecure {
		bad("Config.Coordinators without TLS: set Config.TLSCert, TLSKey and TLSCA (docs/security.md), or Config.Insecure to talk to the coordinators in plaintext")
	}
	if files.Enabled() && cfg.Insecure {
		bad("Config.Insecure and Config.TLSCert/TLSKey/TLSCA: choose plaintext or TLS")
	}
	if cfg.Redis == "" && (cfg.RedisTLS != RedisTLS{}) {
		bad("Config.RedisTLS is set but Config.Redis is empty")
	}
	if err := errors.Join(errs...); err != nil {
		return agent.Config{}, err
	}
	c := agent.DefaultConfig()
	c.RulesFile = cfg.RulesFile
	c.Redis = cfg.Redis
	c.RedisTLS = bucket.RedisTLS{CA: cfg.RedisTLS.CA, Cert: cfg.RedisTLS.Cert, Key: cfg.RedisTLS.Key, ServerName: cfg.RedisTLS.ServerName}
	c.Coordinators = strings.Join(cfg.Coordinators, ",")
	c.TLS = files
	c.Insecure = cfg.Insecure
	c.Record = cfg.RecordFile
	if cfg.AgentID != "" {
		c.AgentID = cfg.AgentID
	}
	if c.AgentID == "" {
		host, _ := os.Hostname()
		c.AgentID = host
	}
	c.Region, c.DecisionTimeout, c.ReloadInterval = DefaultRegion, DefaultDecisionTimeout, DefaultReloadInterval
	if cfg.Region != "" {
		c.Region = cfg.Region
	}
	if cfg.DecisionTimeout > 0 {
		c.DecisionTimeout = cfg.DecisionTimeout
	}
	c.FirstGrantTimeout = cfg.FirstGrantTimeout // 0: the agent's default
	if cfg.ReloadInterval > 0 {
		c.ReloadInterval = cfg.ReloadInterval
	}
	c.Breaker = breaker.DefaultConfig()
	if cfg.BreakerThreshold > 0 {
		c.Breaker.Threshold = cfg.BreakerThreshold
	}
	if cfg.BreakerProbeInterval > 0 {
		c.Breaker.ProbeInterval = cfg.BreakerProbeInterval
	}
	// What is left to check is the sidecar's (the TLS files' contents),
	// and would name its flags: it should never fail here.
	if err := c.CheckCore(); err != nil {
		return agent.Config{}, err
	}
	return c, nil
}

// registerer is a Registerer whose MustRegister keeps the first error
// instead of panicking, so that New can return it.
type registerer struct {
	r   prometheus.Registerer
	mu  sync.Mutex
	err error
}

func (g *registerer) Register(c prometheus.Collector) error  { return g.r.Register(c) }
func (g *registerer) Unregister(c prometheus.Collector) bool { return g.r.Unregister(c) }

func (g *registerer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := g.r.Register(c); err != nil {
			g.mu.Lock()
			if g.err == nil {
				g.err = err
			}
			g.mu.Unlock()
		}
	}
}
