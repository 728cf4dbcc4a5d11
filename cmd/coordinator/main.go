// Command coordinator runs one node of Ration's lease coordinator: a Raft
// group that replicates the lease state and hands budget slices to gateway
// agents (docs/leases.md).
//
//	coordinator -dev                                  # one node, plaintext, temporary data, examples/rules.yaml
//	coordinator -id n1 -bootstrap -data-dir /var/lib/ration -rules rules.yaml -tls-cert n1.crt -tls-key n1.key -tls-ca ca.crt
//	coordinator -id n2 -join 10.0.0.1:8303 -admin 10.0.0.2:8303 -data-dir /var/lib/ration -rules rules.yaml -tls-cert ...
//	coordinator -insecure ...                         # plaintext by choice (no TLS files)
//	coordinator -validate -rules rules.yaml           # check config and rules, then exit
//	coordinator status                                # operator commands, at the admin address (-addr, default 127.0.0.1:8303)
//	coordinator quotas -addr 127.0.0.1:8303
//	coordinator leases -addr 127.0.0.1:8303 [-quota rule|subject]
//	coordinator tune -addr 127.0.0.1:8303 -rule export-global -max-slice 200
//	coordinator tunings -addr 127.0.0.1:8303
//	coordinator members list -addr 127.0.0.1:8303
//	coordinator members add -addr 127.0.0.1:8303 -id n4 -raft-address 10.0.0.4:8300 -grpc-address 10.0.0.4:8301 -admin-address 10.0.0.4:8303
//	coordinator members remove -addr 127.0.0.1:8303 -id n4
//	coordinator -version                              # version, commit, Go version
//
// The lease API (agents, regional groups) is on -grpc (8301), the admin
// API (the commands above, -join) on -admin (8303, loopback by default).
// A node without -tls-cert, -tls-key and -tls-ca refuses to start unless
// -insecure (or -dev) says plaintext is meant (docs/security.md).
//
// Every flag can also be set with a RATION_* environment variable (-h
// names them). SIGTERM or SIGINT: a leader hands leadership over, then the
// node stops. SIGHUP reloads the rules file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ration-dev/ration/examples"
	"github.com/ration-dev/ration/internal/buildinfo"
	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/envflag"
	"github.com/ration-dev/ration/internal/logformat"
	"github.com/ration-dev/ration/internal/rules"
)

// devRules are the rules of -dev without -rules: examples/rules.yaml,
// which gateway-agent -dev runs with too.
var devRules = examples.Rules()

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "coordinator:", err)
		}
		os.Exit(exitCode(err))
	}
}

var errInvalidRules = errors.New("rules file is invalid")

func exitCode(err error) int {
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errInvalidRules):
		return 1
	default:
		return 2
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, lookup func(string) (string, bool)) error {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return runCommand(ctx, args[0], args[1:], stdout, stderr)
	}
	cfg := coordinator.DefaultConfig()
	if devMode(args, lookup) {
		cfg = coordinator.DevConfig()
	}
	opts := defaultOptions()
	// A malformed variable is reported after the flags are parsed, so that
	// -version works whatever the environment holds.
	envErr := errors.Join(cfg.LoadEnv(lookup), opts.loadEnv(lookup))
	fs, version := newFlagSet(&cfg, &opts, stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version {
		buildinfo.Print(stdout, "coordinator")
		return nil
	}
	if envErr != nil {
		return envErr
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (flags only; see -h)", fs.Args())
	}
	set, err := loadRules(cfg)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return fmt.Errorf("%s: %w", cfg.RulesFile, errInvalidRules)
	}
	cfg.Rules = set
	if cfg.Dev && cfg.DataDir == "" {
		dir, err := os.MkdirTemp("", "ration-coordinator-dev-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		cfg.DataDir = dir
	}
	format, formatErr := logformat.Parse(opts.logFormat)
	if formatErr != nil {
		formatErr = fmt.Errorf("-log-format %q: %w", opts.logFormat, formatErr)
	}
	if err := errors.Join(cfg.Validate(), formatErr); err != nil {
		return err
	}
	if cfg.ValidateOnly {
		leased := 0
		for _, r := range set.Rules() {
			if r.Mode.Leases() {
				leased++
			}
		}
		fmt.Fprintf(stdout, "configuration valid; rules: %d, %d leased or auto (version %s)\n", len(set.Rules()), leased, set.Hash())
		if !cfg.TLS.Enabled() && !cfg.Insecure && !cfg.Dev {
			// Not a fault of what was checked, but the one refusal the
			// node would still make when started with these flags.
			fmt.Fprintf(stdout, "note: to run, a node also needs TLS files or -insecure (%v)\n", coordinator.ErrNoTLS)
		}
		return nil
	}

	level, _ := coordinator.ParseLogLevel(cfg.LogLevel)
	logger := logformat.New(stderr, format, level)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector())
	if err := coordinator.BridgeRaftMetrics(reg); err != nil {
		return err
	}
	node, err := coordinator.Start(ctx, cfg, logger, reg)
	if err != nil {
		return err
	}
	switch {
	case cfg.Dev && format == logformat.JSON:
		// Nothing but records on stderr, for whatever reads them.
		logger.Info("coordinator -dev: data deleted on exit", "grpc", node.GRPCAddr(), "http", node.HTTPAddr(), "admin", node.AdminAddr(), "data_dir", cfg.DataDir)
	case cfg.Dev:
		fmt.Fprintf(stderr, "coordinator -dev: gRPC %s, HTTP %s, admin %s, data %s (deleted on exit)\n  try: coordinator status -addr %s\n",
			node.GRPCAddr(), node.HTTPAddr(), node.AdminAddr(), cfg.DataDir, node.AdminAddr())
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-hup:
			if cfg.RulesFile == "" {
				logger.Info("SIGHUP: no -rules file to reload")
				continue
			}
			s, err := rules.Load(cfg.RulesFile)
			if err != nil {
				logger.Error("SIGHUP: rules file rejected; the old rules stay in force", "err", err)
				continue
			}
			node.SetRules(s)
			logger.Info("SIGHUP: rules reloaded", "rules_version", s.Hash())
			continue
		case <-ctx.Done():
			logger.Info("shutting down")
		case <-node.Done():
		}
		break
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	shutdownErr := node.Shutdown(sctx)
	if err := node.Err(); err != nil {
		return err
	}
	return shutdownErr
}

// usage is what -h prints before the flags: the node's command line and
// the operator commands (commands.go).
const usage = `usage: coordinator [flags]                  run a node (flags below)
       coordinator status -addr HOST:PORT    the node's Raft state, members and tunings
       coordinator quotas -addr HOST:PORT    leased quotas: pool, leased caps and rates
       coordinator leases -addr HOST:PORT [-quota RULE|SUBJECT]
                                             live leases, per holder
       coordinator tune -addr HOST:PORT -rule RULE [-region R] [-lease-period D]
                        [-renew-at F] [-min-slice N] [-max-slice N] [-weight W]
                        [-safe-share N [-allow-overshoot]] [-clear]
                                             set (or -clear) a rule's lease tuning at run time
       coordinator tunings -addr HOST:PORT   the tunings in force
       coordinator members list -addr HOST:PORT
                                             the Raft servers, the leader marked
       coordinator members add -addr HOST:PORT -id ID -raft-address HOST:PORT
                               -grpc-address HOST:PORT -admin-address HOST:PORT
                                             add a voter (sent to the leader)
       coordinator members remove -addr HOST:PORT -id ID
                                             remove a server (sent to the leader)
       coordinator COMMAND -h                a command's flags

The commands call a node's admin API: -addr is its -admin address
(default 127.0.0.1:8303), with -tls-cert/-tls-key/-tls-ca (an operator's
certificate) and -token-file (its -admin-token-file) when it needs them.

flags:`

// options are the settings of the command rather than of the node
// (coordinator.Config): how it logs.
type options struct {
	logFormat string // -log-format, RATION_LOG_FORMAT
}

func defaultOptions() options { return options{logFormat: "text"} }

// envPrefix is the prefix of every variable, as in coordinator.Config.
const envPrefix = "RATION_"

func (o *options) settings() []envflag.Setting {
	return []envflag.Setting{
		{Flag: "log-format", Env: "LOG_FORMAT", Usage: logformat.Usage, Value: &o.logFormat},
	}
}

func (o *options) loadEnv(lookup func(string) (string, bool)) error {
	return envflag.Load(envPrefix, o.settings(), lookup)
}

// newFlagSet is the node's command line: every setting of cfg and opts
// (flags over the environment already loaded into them) and -version.
// docs/configuration.md lists the same flags (TestFlagDocs).
func newFlagSet(cfg *coordinator.Config, opts *options, stderr io.Writer) (*flag.FlagSet, *bool) {
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, usage)
		fs.PrintDefaults()
	}
	cfg.BindFlags(fs)
	envflag.Bind(fs, envPrefix, opts.settings())
	version := fs.Bool("version", false, buildinfo.FlagUsage)
	return fs, version
}

// devMode reports whether the command line (over RATION_DEV) turns -dev
// on, read as the flag package reads it, since the defaults it picks
// (DevConfig) come before the flags: every boolean spelling (-dev, --dev,
// -dev=true, -dev=1, -dev=t, ...; -dev=false and -dev=0 turn it off), the
// last one winning, and not a -dev past the end of the flags or taken as
// another flag's value (-rules -dev). Errors are left to the real parse.
func devMode(args []string, lookup func(string) (string, bool)) bool {
	cfg, opts := coordinator.DefaultConfig(), defaultOptions()
	_ = cfg.LoadEnv(lookup)
	fs, _ := newFlagSet(&cfg, &opts, io.Discard)
	_ = fs.Parse(args)
	return cfg.Dev
}

// loadRules reads -rules, or under -dev without -rules the embedded
// sample.
func loadRules(cfg coordinator.Config) (*rules.Set, error) {
	if cfg.RulesFile != "" {
		return rules.Load(cfg.RulesFile)
	}
	if cfg.Dev {
		return rules.Parse(examples.RulesFile+" (embedded)", devRules)
	}
	return nil, nil // Validate reports the missing -rules
}
