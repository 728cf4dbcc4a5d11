package coordinator

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ration-dev/ration/internal/region"
	"github.com/ration-dev/ration/internal/rules"
)

// Config is everything one coordinator node needs. Layers, in order:
// DefaultConfig (or DevConfig under -dev), environment (RATION_*), flags;
// then one Validate pass that reports every problem, each naming its flag.
type Config struct {
	ID string // -id, RATION_ID: Raft server id, stable across restarts
	// RaftAddr is where the Raft TCP transport listens (-raft). It is also
	// the address peers dial unless RaftAdvertise is set, so it must then be
	// a concrete IP, not 0.0.0.0.
	RaftAddr      string // -raft, RATION_RAFT
	RaftAdvertise string // -raft-advertise, RATION_RAFT_ADVERTISE
	// GRPCAddr serves Leases and Admin. GRPCAdvertise (default: the bound
	// address) is what the node replicates as its address, so followers can
	// point clients at the leader.
	GRPCAddr      string // -grpc, RATION_GRPC
	GRPCAdvertise string // -grpc-advertise, RATION_GRPC_ADVERTISE
	HTTPAddr      string // -http, RATION_HTTP: /metrics, /healthz, /readyz; "" disables
	DataDir       string // -data-dir, RATION_DATA_DIR: BoltDB log and snapshots
	Bootstrap     bool   // -bootstrap: form a new cluster with this node as its only voter
	Join          string // -join, RATION_JOIN: admin gRPC address of a member to join through
	RulesFile     string // -rules, RATION_RULES: the quota shapes (burst, rate, lease)
	// Region is the region this group serves (-region, RATION_REGION).
	// Upstream, when set, makes the group regional: the gRPC addresses of
	// the global group (-upstream, RATION_UPSTREAM, comma separated), from
	// which its leader leases every scope: global, mode: leased quota and
	// subleases it to the region's agents. A group without -upstream serving
	// such a rule is the global group: it leases the rule, less the safe
	// shares, to the regional groups.
	Region   string // -region, RATION_REGION
	Upstream string // -upstream, RATION_UPSTREAM
	// UpstreamRenewAt is the renew point of the upstream leases: the
	// fraction of their validity after which the leader renews them.
	UpstreamRenewAt float64 // -upstream-renew-at
	// Rules, when set in code, is used instead of RulesFile (StartDev, tests).
	Rules *rules.Set

	// Raft timing. LeaderLeaseTimeout <= HeartbeatTimeout <= ElectionTimeout.
	HeartbeatTimeout   time.Duration // -raft-heartbeat-timeout
	ElectionTimeout    time.Duration // -raft-election-timeout
	LeaderLeaseTimeout time.Duration // -raft-leader-lease-timeout
	CommitTimeout      time.Duration // -raft-commit-timeout
	SnapshotInterval   time.Duration // -snapshot-interval
	SnapshotThreshold  uint64        // -snapshot-threshold: log entries between snapshots
	TrailingLogs       uint64        // -trailing-logs: entries kept after a snapshot for slow followers
	SnapshotRetain     int           // snapshots kept on disk

	// Leader duties.
	TickInterval time.Duration // -tick: how often the leader commits a Tick (expiry, pool refill)
	BatchMax     int           // -batch-max: commands per Raft entry at most
	BatchWait    time.Duration // -batch-wait: longest a renewal waits for others to share its entry
	ApplyTimeout time.Duration // -apply-timeout: longest a proposal waits to be enqueued by Raft
	// SafetyMargin is added to a lease's expiry before its tokens are
	// reclaimed: it must cover clock-rate drift over a lease period and the
	// largest clock offset between coordinator nodes (docs/leases.md).
	SafetyMargin    time.Duration // -safety-margin
	ShutdownTimeout time.Duration // -shutdown-timeout: leadership transfer and drain on SIGTERM
	MaxItems        int           // items per Renew/Release request at most

	LogLevel     string // -log-level, RATION_LOG_LEVEL
	Dev          bool   // -dev: single node, temporary data dir, bootstrap, sample rules
	ValidateOnly bool   // -validate: check config and rules file, then exit
}

// DefaultConfig is the production starting point: Raft's own defaults for
// timing, a tick twice a second, and batches of up to 512 commands.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		ID:                 host,
		RaftAddr:           "127.0.0.1:8300",
		GRPCAddr:           "127.0.0.1:8301",
		HTTPAddr:           "127.0.0.1:8302",
		DataDir:            "data",
		HeartbeatTimeout:   time.Second,
		ElectionTimeout:    time.Second,
		LeaderLeaseTimeout: 500 * time.Millisecond,
		CommitTimeout:      50 * time.Millisecond,
		SnapshotInterval:   2 * time.Minute,
		SnapshotThreshold:  8192,
		TrailingLogs:       10240,
		SnapshotRetain:     2,
		TickInterval:       500 * time.Millisecond,
		BatchMax:           512,
		BatchWait:          2 * time.Millisecond,
		ApplyTimeout:       5 * time.Second,
		SafetyMargin:       time.Second,
		ShutdownTimeout:    10 * time.Second,
		MaxItems:           10000,
		LogLevel:           "info",
		UpstreamRenewAt:    0.5,
	}
}

// DevConfig is one node on loopback that bootstraps itself, with faster
// elections. The caller picks the data dir (cmd/coordinator uses a
// temporary one) and the rules (the embedded sample unless -rules is given).
func DevConfig() Config {
	c := DefaultConfig()
	c.ID = "dev"
	c.Dev = true
	c.Bootstrap = true
	c.DataDir = ""
	c.HeartbeatTimeout = 200 * time.Millisecond
	c.ElectionTimeout = 200 * time.Millisecond
	c.LeaderLeaseTimeout = 100 * time.Millisecond
	return c
}

// envPrefix is the prefix of every environment variable the coordinator
// reads.
const envPrefix = "RATION_"

// BindFlags registers every flag on fs, with defaults taken from c (which
// already holds the environment layer).
func (c *Config) BindFlags(fs *flag.FlagSet) {
	str := func(p *string, name, env, usage string) {
		fs.StringVar(p, name, *p, fmt.Sprintf("%s (env %s%s)", usage, envPrefix, env))
	}
	dur := func(p *time.Duration, name, env, usage string) {
		fs.DurationVar(p, name, *p, fmt.Sprintf("%s (env %s%s)", usage, envPrefix, env))
	}
	str(&c.ID, "id", "ID", "Raft server id, unique in the cluster and stable across restarts (default: host name)")
	str(&c.RaftAddr, "raft", "RAFT", "Raft TCP bind address (peers dial it unless -raft-advertise is set)")
	str(&c.RaftAdvertise, "raft-advertise", "RAFT_ADVERTISE", "Raft address peers dial, when it differs from -raft")
	str(&c.GRPCAddr, "grpc", "GRPC", "gRPC listen address (ration.v1.Leases and ration.v1.Admin)")
	str(&c.GRPCAdvertise, "grpc-advertise", "GRPC_ADVERTISE", "gRPC address clients are redirected to, when it differs from -grpc")
	str(&c.HTTPAddr, "http", "HTTP", "HTTP listen address for /metrics, /healthz, /readyz (empty disables)")
	str(&c.DataDir, "data-dir", "DATA_DIR", "directory for the Raft log (BoltDB) and snapshots")
	fs.BoolVar(&c.Bootstrap, "bootstrap", c.Bootstrap, "form a new cluster with this node as its only voter (once, on the first node; env RATION_BOOTSTRAP)")
	str(&c.Join, "join", "JOIN", "admin gRPC address of a cluster member to join through")
	str(&c.RulesFile, "rules", "RULES", "rules YAML file giving every leased quota's burst, rate and lease settings")
	str(&c.Region, "region", "REGION", "region this coordinator group serves (required with -upstream)")
	str(&c.Upstream, "upstream", "UPSTREAM", "gRPC addresses of the global coordinator group, comma separated: makes this a regional group that leases scope: global, mode: leased rules from it")
	fs.Float64Var(&c.UpstreamRenewAt, "upstream-renew-at", c.UpstreamRenewAt, "renew point of upstream leases: fraction of their validity after which they are renewed, in (0, 1)")
	dur(&c.HeartbeatTimeout, "raft-heartbeat-timeout", "RAFT_HEARTBEAT_TIMEOUT", "time without leader contact before a follower stands for election")
	dur(&c.ElectionTimeout, "raft-election-timeout", "RAFT_ELECTION_TIMEOUT", "time a candidate waits before a new election")
	dur(&c.LeaderLeaseTimeout, "raft-leader-lease-timeout", "RAFT_LEADER_LEASE_TIMEOUT", "time a leader stays leader without quorum contact")
	dur(&c.CommitTimeout, "raft-commit-timeout", "RAFT_COMMIT_TIMEOUT", "idle time before the leader sends a heartbeat carrying the commit index")
	dur(&c.SnapshotInterval, "snapshot-interval", "SNAPSHOT_INTERVAL", "how often to check whether a snapshot is due")
	fs.Uint64Var(&c.SnapshotThreshold, "snapshot-threshold", c.SnapshotThreshold, "log entries since the last snapshot that make one due (env RATION_SNAPSHOT_THRESHOLD)")
	fs.Uint64Var(&c.TrailingLogs, "trailing-logs", c.TrailingLogs, "log entries kept after a snapshot, so a slow follower catches up without one (env RATION_TRAILING_LOGS)")
	dur(&c.TickInterval, "tick", "TICK", "how often the leader commits a Tick (expiries, pool refill)")
	fs.IntVar(&c.BatchMax, "batch-max", c.BatchMax, "commands per Raft entry at most (env RATION_BATCH_MAX)")
	dur(&c.BatchWait, "batch-wait", "BATCH_WAIT", "longest a renewal waits for others to share its Raft entry")
	dur(&c.ApplyTimeout, "apply-timeout", "APPLY_TIMEOUT", "longest a proposal waits to be taken by Raft")
	dur(&c.SafetyMargin, "safety-margin", "SAFETY_MARGIN", "added to a lease's expiry before its tokens are reclaimed: covers clock drift and offset between coordinator nodes")
	dur(&c.ShutdownTimeout, "shutdown-timeout", "SHUTDOWN_TIMEOUT", "graceful shutdown limit (leadership transfer, draining)")
	str(&c.LogLevel, "log-level", "LOG_LEVEL", "debug, info, warn or error")
	fs.BoolVar(&c.Dev, "dev", c.Dev, "development mode: one node, temporary data dir, bootstrap, sample rules (env RATION_DEV)")
	fs.BoolVar(&c.ValidateOnly, "validate", c.ValidateOnly, "check the configuration and the -rules file, print every problem and exit")
}

// LoadEnv applies RATION_* variables from lookup (os.LookupEnv in main).
// Every malformed value is reported.
func (c *Config) LoadEnv(lookup func(string) (string, bool)) error {
	var errs []error
	get := func(env string) (string, bool) { return lookup(envPrefix + env) }
	str := func(p *string, env string) {
		if v, ok := get(env); ok {
			*p = v
		}
	}
	dur := func(p *time.Duration, env string) {
		if v, ok := get(env); ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s%s=%q: %w", envPrefix, env, v, err))
				return
			}
			*p = d
		}
	}
	boolean := func(p *bool, env string) {
		if v, ok := get(env); ok {
			b, err := strconv.ParseBool(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s%s=%q: not a boolean", envPrefix, env, v))
				return
			}
			*p = b
		}
	}
	u64 := func(p *uint64, env string) {
		if v, ok := get(env); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s%s=%q: not a non-negative integer", envPrefix, env, v))
				return
			}
			*p = n
		}
	}
	str(&c.ID, "ID")
	str(&c.RaftAddr, "RAFT")
	str(&c.RaftAdvertise, "RAFT_ADVERTISE")
	str(&c.GRPCAddr, "GRPC")
	str(&c.GRPCAdvertise, "GRPC_ADVERTISE")
	str(&c.HTTPAddr, "HTTP")
	str(&c.DataDir, "DATA_DIR")
	boolean(&c.Bootstrap, "BOOTSTRAP")
	str(&c.Join, "JOIN")
	str(&c.RulesFile, "RULES")
	str(&c.Region, "REGION")
	str(&c.Upstream, "UPSTREAM")
	dur(&c.HeartbeatTimeout, "RAFT_HEARTBEAT_TIMEOUT")
	dur(&c.ElectionTimeout, "RAFT_ELECTION_TIMEOUT")
	dur(&c.LeaderLeaseTimeout, "RAFT_LEADER_LEASE_TIMEOUT")
	dur(&c.CommitTimeout, "RAFT_COMMIT_TIMEOUT")
	dur(&c.SnapshotInterval, "SNAPSHOT_INTERVAL")
	u64(&c.SnapshotThreshold, "SNAPSHOT_THRESHOLD")
	u64(&c.TrailingLogs, "TRAILING_LOGS")
	dur(&c.TickInterval, "TICK")
	if v, ok := get("BATCH_MAX"); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%sBATCH_MAX=%q: not an integer", envPrefix, v))
		} else {
			c.BatchMax = n
		}
	}
	dur(&c.BatchWait, "BATCH_WAIT")
	dur(&c.ApplyTimeout, "APPLY_TIMEOUT")
	dur(&c.SafetyMargin, "SAFETY_MARGIN")
	dur(&c.ShutdownTimeout, "SHUTDOWN_TIMEOUT")
	str(&c.LogLevel, "LOG_LEVEL")
	boolean(&c.Dev, "DEV")
	return errors.Join(errs...)
}

// maxBatch bounds -batch-max: raft's MaxAppendEntries is 64 entries per
// RPC, and one entry of maxBatch renewals of MaxItems items must stay far
// below the transport's comfort (a few MB).
const maxBatch = 4096

// Validate reports every problem with the configuration at once, each
// naming its flag, and all wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.ID == "" {
		bad("-id: must not be empty (and the host name could not be read)")
	} else if len(c.ID) > 255 || strings.ContainsAny(c.ID, " \t\r\n") {
		bad("-id %q: at most 255 bytes, no white space", c.ID)
	}
	addr := func(flagName, a string, optional bool) {
		if a == "" {
			if !optional {
				bad("%s: must not be empty", flagName)
			}
			return
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			bad("%s %q: %v", flagName, a, err)
		}
	}
	addr("-raft", c.RaftAddr, false)
	addr("-raft-advertise", c.RaftAdvertise, true)
	addr("-grpc", c.GRPCAddr, false)
	addr("-grpc-advertise", c.GRPCAdvertise, true)
	addr("-http", c.HTTPAddr, true)
	addr("-join", c.Join, true)
	if c.RaftAdvertise == "" && unspecifiedHost(c.RaftAddr) {
		bad("-raft %q: peers cannot dial an unspecified address; set -raft-advertise", c.RaftAddr)
	}
	if c.GRPCAdvertise == "" && unspecifiedHost(c.GRPCAddr) {
		bad("-grpc %q: clients cannot be redirected to an unspecified address; set -grpc-advertise", c.GRPCAddr)
	}
	for _, p := range [][2]string{{"-raft", c.RaftAddr}, {"-grpc", c.GRPCAddr}, {"-http", c.HTTPAddr}} {
		for _, q := range [][2]string{{"-grpc", c.GRPCAddr}, {"-http", c.HTTPAddr}} {
			if p[0] < q[0] && p[1] != "" && p[1] == q[1] && !strings.HasSuffix(p[1], ":0") {
				bad("%s and %s are both %q", p[0], q[0], p[1])
			}
		}
	}
	if c.DataDir == "" && !c.Dev {
		bad("-data-dir: must not be empty")
	}
	if c.Bootstrap && c.Join != "" {
		bad("-bootstrap and -join %q: a node either forms a new cluster or joins one", c.Join)
	}
	if c.RulesFile == "" && c.Rules == nil && !c.Dev {
		bad("-rules: a rules file is required (or run with -dev)")
	}
	positive := func(flagName string, d time.Duration) {
		if d <= 0 {
			bad("%s %v: must be positive", flagName, d)
		}
	}
	positive("-raft-heartbeat-timeout", c.HeartbeatTimeout)
	positive("-raft-election-timeout", c.ElectionTimeout)
	positive("-raft-leader-lease-timeout", c.LeaderLeaseTimeout)
	positive("-raft-commit-timeout", c.CommitTimeout)
	positive("-snapshot-interval", c.SnapshotInterval)
	positive("-tick", c.TickInterval)
	positive("-apply-timeout", c.ApplyTimeout)
	positive("-shutdown-timeout", c.ShutdownTimeout)
	if c.LeaderLeaseTimeout > c.HeartbeatTimeout {
		bad("-raft-leader-lease-timeout %v exceeds -raft-heartbeat-timeout %v", c.LeaderLeaseTimeout, c.HeartbeatTimeout)
	}
	if c.ElectionTimeout < c.HeartbeatTimeout {
		bad("-raft-election-timeout %v is below -raft-heartbeat-timeout %v", c.ElectionTimeout, c.HeartbeatTimeout)
	}
	if c.BatchWait < 0 || c.BatchWait > time.Second {
		bad("-batch-wait %v: must be in [0, 1s]", c.BatchWait)
	}
	if c.BatchMax < 1 || c.BatchMax > maxBatch {
		bad("-batch-max %d: must be in [1, %d]", c.BatchMax, maxBatch)
	}
	if c.SafetyMargin < 0 {
		bad("-safety-margin %v: must not be negative", c.SafetyMargin)
	}
	if c.SnapshotThreshold == 0 {
		bad("-snapshot-threshold: must be positive")
	}
	if c.SnapshotRetain < 1 {
		bad("snapshot retain %d: must be at least 1", c.SnapshotRetain)
	}
	if c.MaxItems < 1 {
		bad("max items %d: must be at least 1", c.MaxItems)
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		bad("-log-level %q: %v", c.LogLevel, err)
	}
	if c.Region != "" {
		if msg := region.ID(c.Region).Check(); msg != "" {
			bad("-region: %s", msg)
		}
	}
	if c.Upstream != "" {
		if c.Region == "" {
			bad("-upstream %q: a regional group needs -region (its share of global rules is chosen by it)", c.Upstream)
		}
		for _, a := range c.UpstreamAddrs() {
			addr("-upstream", a, false)
		}
	}
	if !(c.UpstreamRenewAt > 0 && c.UpstreamRenewAt < 1) {
		bad("-upstream-renew-at %v: must be in (0, 1)", c.UpstreamRenewAt)
	}
	return errors.Join(errs...)
}

// UpstreamAddrs splits -upstream.
func (c Config) UpstreamAddrs() []string {
	var out []string
	for _, a := range strings.Split(c.Upstream, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

func unspecifiedHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// ParseLogLevel reads -log-level.
func ParseLogLevel(s string) (slog.Level, error) { return parseLevel(s) }

func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info", "":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, errors.New("want debug, info, warn or error")
}
