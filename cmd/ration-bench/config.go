package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ration-dev/ration/internal/buildinfo"
)

// Modes: what one call is.
const (
	modeAllow  = "allow"  // ration.v1.RateLimiter/Allow: one decision per call
	modeBatch  = "batch"  // AllowBatch: -batch decisions per call
	modeStream = "stream" // AllowStream: one decision per message, one stream per worker
	modeHTTP   = "http"   // GET /v1/check (or POST /v1/allow with -rule/-mix)
	modeEmpty  = "empty"  // grpc.health.v1 Health/Check: the floor of any unary call
	modeEnvoy  = "envoy"  // envoy.service.ratelimit.v3 ShouldRateLimit: one descriptor per call
	modeClient = "client" // the Go client's Client.Allow, every worker on one Client (coalescing per -coalesce)
)

var modes = []string{modeAllow, modeBatch, modeStream, modeHTTP, modeEmpty, modeEnvoy, modeClient}

// Key distributions.
const (
	distUniform = "uniform"
	distZipf    = "zipf"
	distHot     = "hot"
)

var dists = []string{distUniform, distZipf, distHot}

// maxBatch is the agent's limit on one AllowBatch call (agent.MaxBatch).
const maxBatch = 10000

// Config is one benchmark run: DefaultConfig, then flags, then Check.
type Config struct {
	Mode        string
	Targets     []string // gRPC host:port, loopback only
	HTTPTargets []string // HTTP host:port, loopback only
	Conns       int      // gRPC connections, spread round-robin over Targets; 0 = auto

	Batch         int
	Keys          int
	Dist          string
	ZipfS         float64
	Rule          string
	Mix           []weightedRule
	DescriptorKey string
	Descriptors   map[string]string // fixed extra descriptors, sent with every request
	KeyPrefix     string
	Cost          float64
	Seed          uint64

	Concurrency    int     // closed loop: workers, each one call in flight
	Rate           float64 // open loop: decisions per second; 0 = closed loop
	MaxOutstanding int     // open loop: cap on calls in flight

	Duration time.Duration // measured time; 0 = until -requests
	Requests int64         // measured decisions cap; 0 = until -duration
	Warmup   time.Duration // not counted
	Timeout  time.Duration // per call (per message for streams)
	// Coalesce is the Go client's Options.CoalesceDelay (-mode client):
	// 0 its default, negative off (every Allow a unary call).
	Coalesce time.Duration
	// CoalesceInFlight is its Options.CoalesceInFlight (0: its default).
	CoalesceInFlight int

	PIDs       []int
	JSON       bool
	CPUProfile string // write this tool's CPU profile here

	// TLS dials agents started with -listen-tls (and -listen-client-auth);
	// tlsConfig is what parseFlags read from its files (nil: plaintext).
	TLS       tlsFiles
	tlsConfig *tls.Config
}

// weightedRule is one entry of -mix.
type weightedRule struct {
	Rule   string  `json:"rule"`
	Weight float64 `json:"weight"`
}

// DefaultConfig targets a gateway-agent started with its default addresses.
func DefaultConfig() Config {
	return Config{
		Mode:           modeAllow,
		Targets:        []string{"127.0.0.1:8081"},
		HTTPTargets:    []string{"127.0.0.1:8080"},
		Batch:          100,
		Keys:           10000,
		Dist:           distUniform,
		ZipfS:          1.1,
		DescriptorKey:  "user",
		KeyPrefix:      "k",
		Cost:           1,
		Seed:           1,
		Concurrency:    64,
		MaxOutstanding: 1024,
		Duration:       10 * time.Second,
		Warmup:         time.Second,
		Timeout:        5 * time.Second,
	}
}

// errUsage marks a problem with the command line (exit status 2).
var errUsage = errors.New("usage")

// errVersion: -version was given; run prints the build and exits 0.
var errVersion = errors.New("version requested")

// usageError wraps every flag problem so main can pick the exit status.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() []error {
	return []error{errUsage, e.err}
}

const usageHead = `ration-bench drives gateway-agents with decisions and reports throughput,
outcomes, latency percentiles (HDR histogram) and CPU per decision.

Usage:
  ration-bench [flags]
  ration-bench plan [flags]     size Redis shards, agent cores and coordinator
                                nodes from measured costs (plan -h; docs/capacity.md)
  ration-bench protoset FILE    write the agent's services as a FileDescriptorSet,
                                for a generic gRPC load tool (ghz --protoset FILE)

Examples:
  ration-bench -mode empty                                   # the floor: gRPC health check
  ration-bench -mode allow -keys 10000 -dist uniform         # unary Allow, descriptors user=<key>
  ration-bench -mode batch -batch 100 -rule per-user -dist zipf
  ration-bench -mode stream -mix per-user:9,export-global:1
  ration-bench -mode http -http-target 127.0.0.1:8080 -dist hot
  ration-bench -mode allow -rate 20000 -duration 30s        # open loop, latency from intended send time
  ration-bench -pids $(pgrep -d, -x redis-server) -json      # CPU µs/decision of given processes
  ration-bench -tls-ca certs/ca.crt -tls-cert certs/gateway-dev.crt -tls-key certs/gateway-dev.key
                                                             # an agent with -listen-tls -listen-client-auth

Targets must be loopback addresses (127.0.0.0/8, ::1 or localhost).
An agent serving TLS (-listen-tls) is dialed with -tls-ca (its CA), and
one requiring client certificates (-listen-client-auth) with -tls-cert and
-tls-key too; -mode http then speaks HTTPS.
Closed loop (default): -concurrency workers, each with one call in flight.
Open loop (-rate R): calls start at fixed intervals whether or not earlier
ones answered; latency counts from the intended start, so a stalled server
shows in the tail (no coordinated omission); at most -max-outstanding calls
are in flight, and intended calls that could not start before the end are
reported as unsent.
Batch latency is reported per call and per decision (the call's latency
divided by its size: amortized). Live progress goes to stderr once a second
when it is a terminal.

Flags:
`

// parseFlags builds a Config from args. -h returns flag.ErrHelp after
// printing usage to stderr.
func parseFlags(args []string, stderr io.Writer) (Config, error) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("ration-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageHead)
		fs.PrintDefaults()
	}
	var targets, httpTargets, mix, descriptors, pids string
	targets = strings.Join(cfg.Targets, ",")
	httpTargets = strings.Join(cfg.HTTPTargets, ",")
	fs.StringVar(&cfg.Mode, "mode", cfg.Mode, "what to call: "+strings.Join(modes, ", ")+
		"\n(allow = unary Allow, batch = AllowBatch, stream = AllowStream, http = GET /v1/check, empty = grpc.health.v1 Health/Check,"+
		"\nenvoy = Envoy's ShouldRateLimit: domain ration-bench, one descriptor with allow's descriptors as its entries)")
	fs.StringVar(&targets, "target", targets, "gRPC agent address host:port, or a comma list (connections go round-robin)")
	fs.StringVar(&httpTargets, "http-target", httpTargets, "HTTP agent address host:port, or a comma list (-mode http)")
	fs.IntVar(&cfg.Conns, "conns", 0, "gRPC connections, spread round-robin over -target (0: 4; at least one per target)")
	fs.IntVar(&cfg.Batch, "batch", cfg.Batch, fmt.Sprintf("decisions per AllowBatch call (-mode batch), 1 to %d", maxBatch))
	fs.IntVar(&cfg.Keys, "keys", cfg.Keys, "number of distinct subjects (keys)")
	fs.StringVar(&cfg.Dist, "dist", cfg.Dist, "key distribution: uniform, zipf (skew -zipf-s) or hot (every request the same key)")
	fs.Float64Var(&cfg.ZipfS, "zipf-s", cfg.ZipfS, "zipf skew s (> 1): key k is drawn with probability proportional to (k+1)^-s")
	fs.StringVar(&cfg.Rule, "rule", "", "rule name: requests name rule+subject (otherwise descriptors -descriptor-key=<subject>)")
	fs.StringVar(&mix, "mix", "", "mix of rules by weight, e.g. per-user:9,export-global:1 (instead of -rule)")
	fs.StringVar(&cfg.DescriptorKey, "descriptor-key", cfg.DescriptorKey, "descriptor key whose value is the subject, when no -rule or -mix")
	fs.StringVar(&descriptors, "descriptors", "", "fixed extra descriptors sent with every request, e.g. endpoint=search,method=GET")
	fs.StringVar(&cfg.KeyPrefix, "key-prefix", cfg.KeyPrefix, "subjects are <prefix><n>, n in [0, -keys)")
	fs.Float64Var(&cfg.Cost, "cost", cfg.Cost, "tokens each decision asks for")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed: the same seed draws the same keys per worker")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "closed loop: concurrent callers, each with one call in flight")
	fs.Float64Var(&cfg.Rate, "rate", 0, "open loop: decisions per second to start (0: closed loop at -concurrency)")
	fs.IntVar(&cfg.MaxOutstanding, "max-outstanding", cfg.MaxOutstanding, "open loop: most calls in flight at once")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "measured time after the warmup (0: run until -requests)")
	fs.Int64Var(&cfg.Requests, "requests", 0, "stop after this many measured decisions (0: no count cap)")
	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "load before measuring, not counted")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "deadline of each call (each message on a stream)")
	fs.DurationVar(&cfg.Coalesce, "coalesce", 0, "-mode client: the Go client's CoalesceDelay (0: its default; negative: off, every Allow a unary call)")
	fs.IntVar(&cfg.CoalesceInFlight, "coalesce-in-flight", 0, "-mode client: the Go client's CoalesceInFlight (0: its default)")
	fs.StringVar(&pids, "pids", "", "comma list of process ids whose CPU time (utime+stime from /proc) is reported per decision")
	fs.BoolVar(&cfg.JSON, "json", false, "print the report as JSON on stdout (instead of text)")
	fs.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write this tool's own CPU profile to the file (is the load generator the bottleneck?)")
	fs.StringVar(&cfg.TLS.CA, "tls-ca", "", "PEM CA bundle the agent's certificate must chain to: dial TLS (an agent with -listen-tls; HTTPS in -mode http)")
	fs.StringVar(&cfg.TLS.Cert, "tls-cert", "", "PEM client certificate to present (an agent with -listen-client-auth); needs -tls-ca and -tls-key")
	fs.StringVar(&cfg.TLS.Key, "tls-key", "", "PEM private key of -tls-cert")
	fs.StringVar(&cfg.TLS.ServerName, "tls-server-name", "", "name to verify the agent's certificate against (default: the host of -target or -http-target)")
	version := fs.Bool("version", false, buildinfo.FlagUsage)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		return cfg, usageError{err}
	}
	if *version {
		return cfg, errVersion
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q (flags only; see -h)", fs.Args()))
	}
	cfg.Targets = splitList(targets)
	cfg.HTTPTargets = splitList(httpTargets)
	var err error
	if cfg.Mix, err = parseMix(mix); err != nil {
		errs = append(errs, err)
	}
	if cfg.Descriptors, err = parseDescriptors(descriptors); err != nil {
		errs = append(errs, err)
	}
	if cfg.PIDs, err = parsePIDs(pids); err != nil {
		errs = append(errs, err)
	}
	if set["batch"] && cfg.Mode != modeBatch {
		errs = append(errs, fmt.Errorf("-batch %d: only -mode batch sends batches (mode is %q)", cfg.Batch, cfg.Mode))
	}
	if (set["coalesce"] || set["coalesce-in-flight"]) && cfg.Mode != modeClient {
		errs = append(errs, fmt.Errorf("-coalesce and -coalesce-in-flight are for -mode client (mode is %q)", cfg.Mode))
	}
	if set["max-outstanding"] && cfg.Rate == 0 {
		errs = append(errs, errors.New("-max-outstanding applies to the open loop: set -rate too"))
	}
	if set["concurrency"] && cfg.Rate > 0 {
		errs = append(errs, errors.New("-concurrency is the closed loop; with -rate the cap is -max-outstanding"))
	}
	if set["http-target"] && cfg.Mode != modeHTTP {
		errs = append(errs, fmt.Errorf("-http-target is for -mode http (mode is %q; use -target)", cfg.Mode))
	}
	if err := errors.Join(append(errs, cfg.Check())...); err != nil {
		return cfg, usageError{err}
	}
	// The files are read once, here, so that a wrong path or a key that
	// is not the certificate's stops the run before any load.
	if cfg.tlsConfig, err = cfg.TLS.config(); err != nil {
		return cfg, usageError{err}
	}
	return cfg, nil
}

// Check reports every problem with c at once.
func (c Config) Check() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !slices.Contains(modes, c.Mode) {
		add("-mode %q: want one of %s", c.Mode, strings.Join(modes, ", "))
	}
	if c.Mode == modeHTTP {
		if len(c.HTTPTargets) == 0 {
			add("-http-target: no address given")
		}
		for _, t := range c.HTTPTargets {
			if err := checkLoopback(t); err != nil {
				add("-http-target: %w", err)
			}
		}
	} else {
		if len(c.Targets) == 0 {
			add("-target: no address given")
		}
		for _, t := range c.Targets {
			if err := checkLoopback(t); err != nil {
				add("-target: %w", err)
			}
		}
	}
	if c.Conns < 0 || c.Conns > 1024 {
		add("-conns %d: want 0 (auto) to 1024", c.Conns)
	}
	if c.Batch < 1 || c.Batch > maxBatch {
		add("-batch %d: want 1 to %d", c.Batch, maxBatch)
	}
	if c.Keys < 1 || c.Keys > 1<<30 {
		add("-keys %d: want 1 to %d", c.Keys, 1<<30)
	}
	if !slices.Contains(dists, c.Dist) {
		add("-dist %q: want one of %s", c.Dist, strings.Join(dists, ", "))
	}
	if !(c.ZipfS > 1) || math.IsInf(c.ZipfS, 0) {
		add("-zipf-s %v: must be a finite number > 1", c.ZipfS)
	}
	if c.Rule != "" && len(c.Mix) > 0 {
		add("-rule %q and -mix: give one of them", c.Rule)
	}
	if c.Mode == modeEnvoy && (c.Rule != "" || len(c.Mix) > 0) {
		add("-mode envoy sends descriptors: -rule and -mix do not apply")
	}
	if c.Mode == modeEnvoy && c.Cost != math.Trunc(c.Cost) {
		add("-cost %v: Envoy's hits_addend is a whole number", c.Cost)
	}
	if (c.Rule != "" || len(c.Mix) > 0) && len(c.Descriptors) > 0 {
		add("-descriptors: a request names either a rule (-rule/-mix) or descriptors, not both")
	}
	if c.Rule == "" && len(c.Mix) == 0 && c.DescriptorKey == "" {
		add("-descriptor-key: empty (needed when there is no -rule or -mix)")
	}
	if _, ok := c.Descriptors[c.DescriptorKey]; ok && c.Rule == "" && len(c.Mix) == 0 {
		add("-descriptors sets %q, which -descriptor-key already uses for the subject", c.DescriptorKey)
	}
	if !(c.Cost > 0) || math.IsInf(c.Cost, 0) {
		add("-cost %v: must be a finite number > 0", c.Cost)
	}
	if c.Concurrency < 1 || c.Concurrency > 100000 {
		add("-concurrency %d: want 1 to 100000", c.Concurrency)
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		add("-rate %v: must be a finite number >= 0", c.Rate)
	}
	if c.MaxOutstanding < 1 || c.MaxOutstanding > 100000 {
		add("-max-outstanding %d: want 1 to 100000", c.MaxOutstanding)
	}
	if c.Duration < 0 {
		add("-duration %v: must not be negative", c.Duration)
	}
	if c.Requests < 0 {
		add("-requests %d: must not be negative", c.Requests)
	}
	if c.Duration == 0 && c.Requests == 0 {
		add("-duration 0 and -requests 0: the run would never end; set one of them")
	}
	if c.Warmup < 0 {
		add("-warmup %v: must not be negative", c.Warmup)
	}
	if c.Timeout <= 0 {
		add("-timeout %v: must be positive", c.Timeout)
	}
	errs = append(errs, c.TLS.check()...)
	return errors.Join(errs...)
}

// checkLoopback accepts host:port with a loopback IP or "localhost": this
// tool generates load and must never be pointed at another machine.
func checkLoopback(hostport string) error {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return fmt.Errorf("%q: %w", hostport, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: port %q is not a number in 1..65535", hostport, port)
	}
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.Unmap().IsLoopback() {
		return fmt.Errorf("%q: only loopback addresses may be targets (127.0.0.0/8, ::1 or localhost)", hostport)
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// parseMix reads "rule:weight,rule:weight".
func parseMix(s string) ([]weightedRule, error) {
	var out []weightedRule
	var errs []error
	seen := map[string]bool{}
	for _, part := range splitList(s) {
		name, w, ok := strings.Cut(part, ":")
		name = strings.TrimSpace(name)
		weight, err := strconv.ParseFloat(strings.TrimSpace(w), 64)
		switch {
		case !ok || name == "":
			errs = append(errs, fmt.Errorf("-mix %q: want rule:weight", part))
		case err != nil || !(weight > 0) || math.IsInf(weight, 0):
			errs = append(errs, fmt.Errorf("-mix %q: weight must be a finite number > 0", part))
		case seen[name]:
			errs = append(errs, fmt.Errorf("-mix: rule %q given twice", name))
		default:
			seen[name] = true
			out = append(out, weightedRule{Rule: name, Weight: weight})
		}
	}
	return out, errors.Join(errs...)
}

// parseDescriptors reads "k=v,k2=v2".
func parseDescriptors(s string) (map[string]string, error) {
	var errs []error
	out := map[string]string{}
	for _, part := range splitList(s) {
		k, v, ok := strings.Cut(part, "=")
		switch {
		case !ok || k == "" || v == "":
			errs = append(errs, fmt.Errorf("-descriptors %q: want key=value", part))
		case out[k] != "":
			errs = append(errs, fmt.Errorf("-descriptors: key %q given twice", k))
		default:
			out[k] = v
		}
	}
	if len(out) == 0 {
		out = nil
	}
	return out, errors.Join(errs...)
}

func parsePIDs(s string) ([]int, error) {
	var out []int
	var errs []error
	for _, part := range splitList(s) {
		p, err := strconv.Atoi(part)
		if err != nil || p < 1 {
			errs = append(errs, fmt.Errorf("-pids: %q is not a process id", part))
			continue
		}
		out = append(out, p)
	}
	return out, errors.Join(errs...)
}

// connCount is how many gRPC connections to open: -conns (default 4), no
// more than there are workers, but at least one per target so each is
// checked before the run.
func (c Config) connCount() int {
	n := c.Conns
	switch {
	case n == 0 && c.Mode == modeClient:
		n = 1 // one Client shared by every worker, as a service shares one
	case n == 0:
		n = 4
	}
	return max(1, len(c.Targets), min(n, c.workers()))
}

// workers is the number of goroutines making calls.
func (c Config) workers() int {
	if c.Rate > 0 {
		return c.MaxOutstanding
	}
	return c.Concurrency
}

// perCall is how many decisions one call carries.
func (c Config) perCall() int {
	if c.Mode == modeBatch {
		return c.Batch
	}
	return 1
}
