package coordinator

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ration-dev/ration/internal/envflag"
	"github.com/ration-dev/ration/internal/region"
	"github.com/ration-dev/ration/internal/rules"
	"github.com/ration-dev/ration/internal/tlsfiles"
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
	// GRPCAddr serves Leases (agents, regional groups) and nothing else.
	// GRPCAdvertise (default: the bound address) is what the node
	// replicates as its address, so followers can point clients at the
	// leader.
	GRPCAddr      string // -grpc, RATION_GRPC
	GRPCAdvertise string // -grpc-advertise, RATION_GRPC_ADVERTISE
	// AdminAddr serves Admin (operators, the CLI, nodes joining) and
	// nothing else, on loopback by default. AdminAdvertise (default: the
	// bound address) is replicated like GRPCAdvertise, so that a follower
	// points admin calls at the leader's admin address.
	AdminAddr      string // -admin, RATION_ADMIN
	AdminAdvertise string // -admin-advertise, RATION_ADMIN_ADVERTISE
	// AdminTokenFile, when set, names a file holding a bearer token that
	// every admin call must carry (authorization: Bearer <token>), with or
	// without TLS; reloaded when it changes. The node's own -join call
	// sends it.
	AdminTokenFile string // -admin-token-file, RATION_ADMIN_TOKEN_FILE
	HTTPAddr       string // -http, RATION_HTTP: /metrics, /healthz, /readyz; "" disables
	DataDir        string // -data-dir, RATION_DATA_DIR: BoltDB log and snapshots
	Bootstrap      bool   // -bootstrap: form a new cluster with this node as its only voter
	Join           string // -join, RATION_JOIN: admin address (-admin) of a member to join through
	// InitialMembers (-initial-members, RATION_INITIAL_MEMBERS, comma
	// separated) are the server ids registered, when this node bootstraps
	// the group, to add themselves with their own certificates (-join).
	// Read only by a node that bootstraps; later changes are the
	// operator's (coordinator members allow, remove).
	InitialMembers string
	RulesFile      string // -rules, RATION_RULES: the quota shapes (burst, rate, lease)
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

	// TLS names the certificate, key and CA bundle of every link: the
	// gRPC listener (mutual TLS, holders bound to their certificates), the
	// Raft transport (its group's members only) and the node's own
	// calls to other groups. The files are reloaded when they change.
	TLS tlsfiles.Files // -tls-cert, -tls-key, -tls-ca
	// Insecure runs every link in plaintext, with no authentication (but
	// the admin token, when set). Without TLS files, a node starts only
	// with it or -dev (docs/security.md).
	Insecure bool // -insecure, RATION_INSECURE
	// TLSReloadInterval is how often the TLS files and the admin token
	// file are checked for a change (0: tlsfiles.DefaultInterval). Not a
	// flag: tests shorten it.
	TLSReloadInterval time.Duration

	// StatusDetails shows holders, lease ids, subjects and tunings on the
	// status page and /status.json, which otherwise show counts, rates and
	// health only: the -http port has no authentication, and these are
	// what the admin API keeps to operators (status.go). -dev implies it.
	StatusDetails bool // -status-details, RATION_STATUS_DETAILS

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
		AdminAddr:          "127.0.0.1:8303",
		DataDir:            "data",
		HeartbeatTimeout:   time.Second,
		ElectionTimeout:    time.Second,
		LeaderLeaseTimeout: 500 * time.Millisecond,
		CommitTimeout:      50 * time.Millisecond,
		// Renewal entries are large (a 1000-item renewal is about 140 KB
		// of JSON) and the lease state is cheap to snapshot (a few MB per
		// 10,000 live quotas), so the log is compacted often and kept
		// short: at most about threshold + trailing entries stay on disk.
		// Raft's defaults (8192, 10240, 2 min) let a busy group grow its
		// log to hundreds of MB before the first snapshot.
		SnapshotInterval:  30 * time.Second,
		SnapshotThreshold: 1024,
		TrailingLogs:      1024,
		SnapshotRetain:    2,
		TickInterval:      500 * time.Millisecond,
		BatchMax:          512,
		BatchWait:         2 * time.Millisecond,
		ApplyTimeout:      5 * time.Second,
		SafetyMargin:      time.Second,
		ShutdownTimeout:   10 * time.Second,
		MaxItems:          10000,
		LogLevel:          "info",
		UpstreamRenewAt:   0.5,
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

// settings is the one table of the coordinator's flags and RATION_*
// variables.
func (c *Config) settings() []envflag.Setting {
	return []envflag.Setting{
		{Flag: "id", Env: "ID", Usage: "Raft server id, unique in the cluster and stable across restarts (default: host name)", Value: &c.ID},
		{Flag: "raft", Env: "RAFT", Usage: "Raft TCP bind address (peers dial it unless -raft-advertise is set)", Value: &c.RaftAddr},
		{Flag: "raft-advertise", Env: "RAFT_ADVERTISE", Usage: "Raft address peers dial, when it differs from -raft", Value: &c.RaftAdvertise},
		{Flag: "grpc", Env: "GRPC", Usage: "lease API listen address (ration.v1.Leases, for agents and regional groups; not the admin API)", Value: &c.GRPCAddr},
		{Flag: "grpc-advertise", Env: "GRPC_ADVERTISE", Usage: "lease address clients are redirected to, when it differs from -grpc", Value: &c.GRPCAdvertise},
		{Flag: "admin", Env: "ADMIN", Usage: "admin API listen address (ration.v1.Admin: the coordinator CLI, -join); keep it on loopback or behind a NetworkPolicy", Value: &c.AdminAddr},
		{Flag: "admin-advertise", Env: "ADMIN_ADVERTISE", Usage: "admin address admin calls and joining nodes are redirected to, when it differs from -admin", Value: &c.AdminAdvertise},
		{Flag: "admin-token-file", Env: "ADMIN_TOKEN_FILE", Usage: "file holding a bearer token every admin call must carry (authorization: Bearer <token>), with or without TLS; reloaded when it changes", Value: &c.AdminTokenFile},
		{Flag: "http", Env: "HTTP", Usage: "HTTP listen address for /metrics, /healthz, /readyz and the status page (/, /status.json) (empty disables)", Value: &c.HTTPAddr},
		{Flag: "status-details", Env: "STATUS_DETAILS", Usage: "show holder names, lease ids, subjects and tunings on the status page and /status.json, which anyone reaching -http can read (default: counts, rates and health only; the details through the admin API)", Value: &c.StatusDetails},
		{Flag: "data-dir", Env: "DATA_DIR", Usage: "directory for the Raft log (BoltDB) and snapshots", Value: &c.DataDir},
		{Flag: "bootstrap", Env: "BOOTSTRAP", Usage: "form a new cluster with this node as its only voter (once, on the first node)", Value: &c.Bootstrap},
		{Flag: "join", Env: "JOIN", Usage: "admin address (-admin) of a cluster member to join through", Value: &c.Join},
		{Flag: "initial-members", Env: "INITIAL_MEMBERS", Usage: "server ids, comma separated, that may join the group with their own certificates, registered when this node bootstraps it (read only with -bootstrap; later: coordinator members allow)", Value: &c.InitialMembers},
		{Flag: "rules", Env: "RULES", Usage: "rules YAML file giving every leased quota's burst, rate and lease settings", Value: &c.RulesFile},
		{Flag: "region", Env: "REGION", Usage: "region this coordinator group serves (required with -upstream); also the group's name in its members' certificates, ration://coordinator/<region>/<id> (ration://coordinator/global/<id> without -region)", Value: &c.Region},
		{Flag: "upstream", Env: "UPSTREAM", Usage: "gRPC addresses of the global coordinator group, comma separated: makes this a regional group that leases scope: global, mode: leased rules from it", Value: &c.Upstream},
		{Flag: "upstream-renew-at", Env: "UPSTREAM_RENEW_AT", Usage: "renew point of upstream leases: fraction of their validity after which they are renewed, in (0, 1)", Value: &c.UpstreamRenewAt},
		{Flag: "raft-heartbeat-timeout", Env: "RAFT_HEARTBEAT_TIMEOUT", Usage: "time without leader contact before a follower stands for election", Value: &c.HeartbeatTimeout},
		{Flag: "raft-election-timeout", Env: "RAFT_ELECTION_TIMEOUT", Usage: "time a candidate waits before a new election", Value: &c.ElectionTimeout},
		{Flag: "raft-leader-lease-timeout", Env: "RAFT_LEADER_LEASE_TIMEOUT", Usage: "time a leader stays leader without quorum contact", Value: &c.LeaderLeaseTimeout},
		{Flag: "raft-commit-timeout", Env: "RAFT_COMMIT_TIMEOUT", Usage: "idle time before the leader sends a heartbeat carrying the commit index", Value: &c.CommitTimeout},
		{Flag: "snapshot-interval", Env: "SNAPSHOT_INTERVAL", Usage: "how often to check whether a snapshot is due", Value: &c.SnapshotInterval},
		{Flag: "snapshot-threshold", Env: "SNAPSHOT_THRESHOLD", Usage: "log entries since the last snapshot that make one due", Value: &c.SnapshotThreshold},
		{Flag: "trailing-logs", Env: "TRAILING_LOGS", Usage: "log entries kept after a snapshot, so a slow follower catches up without one", Value: &c.TrailingLogs},
		{Flag: "tick", Env: "TICK", Usage: "how often the leader commits a Tick (expiries, pool refill)", Value: &c.TickInterval},
		{Flag: "batch-max", Env: "BATCH_MAX", Usage: "commands per Raft entry at most", Value: &c.BatchMax},
		{Flag: "batch-wait", Env: "BATCH_WAIT", Usage: "longest a renewal waits for others to share its Raft entry", Value: &c.BatchWait},
		{Flag: "apply-timeout", Env: "APPLY_TIMEOUT", Usage: "longest a proposal waits to be taken by Raft", Value: &c.ApplyTimeout},
		{Flag: "safety-margin", Env: "SAFETY_MARGIN", Usage: "added to a lease's expiry before its tokens are reclaimed: covers clock drift and offset between coordinator nodes", Value: &c.SafetyMargin},
		{Flag: "shutdown-timeout", Env: "SHUTDOWN_TIMEOUT", Usage: "graceful shutdown limit (leadership transfer, draining)", Value: &c.ShutdownTimeout},
		{Flag: "tls-cert", Env: "TLS_CERT", Usage: "PEM certificate (chain) of this node, for mutual TLS on gRPC, Raft and calls to other groups; reloaded when it changes", Value: &c.TLS.Cert},
		{Flag: "tls-key", Env: "TLS_KEY", Usage: "PEM private key of -tls-cert", Value: &c.TLS.Key},
		{Flag: "tls-ca", Env: "TLS_CA", Usage: "PEM CA bundle that clients' and peers' certificates must chain to", Value: &c.TLS.CA},
		{Flag: "insecure", Env: "INSECURE", Usage: "plaintext and unauthenticated on every link, by choice (-dev implies it); without TLS files and without it the node refuses to start", Value: &c.Insecure},
		{Flag: "log-level", Env: "LOG_LEVEL", Usage: "debug, info, warn or error", Value: &c.LogLevel},
		{Flag: "dev", Env: "DEV", Usage: "development mode: one node, temporary data dir, bootstrap, sample rules", Value: &c.Dev},
		{Flag: "validate", Usage: "check the configuration and the -rules file, print every problem and exit (TLS files are checked when given, not required)", Value: &c.ValidateOnly},
	}
}

// BindFlags registers every flag on fs, with defaults taken from c (which
// already holds the environment layer).
func (c *Config) BindFlags(fs *flag.FlagSet) { envflag.Bind(fs, envPrefix, c.settings()) }

// LoadEnv applies RATION_* variables from lookup (os.LookupEnv in main).
// Every malformed value is reported.
func (c *Config) LoadEnv(lookup func(string) (string, bool)) error {
	return envflag.Load(envPrefix, c.settings(), lookup)
}

// ErrNoTLS is the refusal of a node configured with neither TLS files nor
// -insecure (nor -dev): plaintext only by choice.
var ErrNoTLS = errors.New("no TLS files: set -tls-cert, -tls-key, -tls-ca (docs/security.md), or -insecure to run in plaintext")

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
	addr("-admin", c.AdminAddr, false)
	addr("-admin-advertise", c.AdminAdvertise, true)
	addr("-http", c.HTTPAddr, true)
	addr("-join", c.Join, true)
	if c.RaftAdvertise == "" && unspecifiedHost(c.RaftAddr) {
		bad("-raft %q: peers cannot dial an unspecified address; set -raft-advertise", c.RaftAddr)
	}
	if c.GRPCAdvertise == "" && unspecifiedHost(c.GRPCAddr) {
		bad("-grpc %q: clients cannot be redirected to an unspecified address; set -grpc-advertise", c.GRPCAddr)
	}
	if c.AdminAdvertise == "" && unspecifiedHost(c.AdminAddr) {
		bad("-admin %q: admin calls cannot be redirected to an unspecified address; set -admin-advertise", c.AdminAddr)
	}
	listeners := [][2]string{{"-raft", c.RaftAddr}, {"-grpc", c.GRPCAddr}, {"-admin", c.AdminAddr}, {"-http", c.HTTPAddr}}
	for i, p := range listeners {
		for _, q := range listeners[i+1:] {
			if p[1] != "" && p[1] == q[1] && !strings.HasSuffix(p[1], ":0") {
				bad("%s and %s are both %q", p[0], q[0], p[1])
			}
		}
	}
	if c.DataDir == "" && !c.Dev {
		bad("-data-dir: must not be empty")
	}
	for _, id := range c.InitialMemberIDs() {
		if err := checkServerID(id); err != nil {
			bad("-initial-members: %v", err)
		}
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
	if err := c.TLS.Check(); err != nil {
		bad("%v", err)
	}
	if c.TLS.Enabled() && c.Insecure {
		bad("-insecure and -tls-cert/-tls-key/-tls-ca: choose plaintext or TLS")
	}
	// -validate checks a rules file before an apply, on a laptop or in CI
	// where the node's TLS files are not: their absence is no fault of
	// the file (the files themselves, when named, are still checked).
	if !c.TLS.Enabled() && !c.Insecure && !c.Dev && !c.ValidateOnly {
		bad("%v", ErrNoTLS)
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
		if c.Region == tlsfiles.GlobalGroup {
			bad("-region %q with -upstream: %q names the global group (the one without -upstream); a regional group needs a name of its own", c.Region, c.Region)
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

// Group is the name of this node's coordinator group, which its
// certificate's coordinator identity names
// (ration://coordinator/<group>/<id>): its -region, or "global" for the
// group that serves no region of its own. Members of other groups (the
// same CA signs them all) are not members of this one.
func (c Config) Group() string {
	if c.Region != "" {
		return c.Region
	}
	return tlsfiles.GlobalGroup
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

// InitialMemberIDs are the ids of -initial-members, without blanks and
// duplicates.
func (c Config) InitialMemberIDs() []string {
	var ids []string
	for _, id := range strings.Split(c.InitialMembers, ",") {
		if id = strings.TrimSpace(id); id != "" && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids
}
