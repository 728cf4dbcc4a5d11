// Command gateway-agent is Ration's sidecar: it decides, for every API
// request its gateway asks about, whether the caller still has budget.
//
//	gateway-agent -dev                              # try it: no Redis needed
//	gateway-agent -rules rules.yaml -redis host:6379
//	gateway-agent -rules leased.yaml -coordinators host:8301  # every rule mode: leased: no Redis
//	gateway-agent -validate -rules rules.yaml       # check a file and exit
//	gateway-agent -version                          # version, commit, Go version
//
// Every flag can also be set with a RATION_* environment variable; see
// docs/configuration.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/buildinfo"
	"github.com/ration-dev/ration/internal/logformat"
	"github.com/ration-dev/ration/internal/rules"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "gateway-agent:", err)
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
	cfg := agent.DefaultConfig()
	if devMode(args, lookup) {
		cfg = agent.DevConfig()
	}
	// A malformed variable is reported after the flags are parsed, so that
	// -version and -h work whatever the environment holds.
	envErr := cfg.LoadEnv(lookup)
	fs, version := newFlagSet(&cfg, stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version {
		buildinfo.Print(stdout, "gateway-agent")
		return nil
	}
	if envErr != nil {
		return envErr
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (flags only; see -h)", fs.Args())
	}
	if err := cfg.Check(); err != nil {
		return err
	}
	if cfg.Validate {
		set, err := rules.Load(cfg.RulesFile)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return fmt.Errorf("%s: %w", cfg.RulesFile, errInvalidRules)
		}
		fmt.Fprintf(stdout, "%s: %d rules, valid (version %s)\n", cfg.RulesFile, len(set.Rules()), set.Hash())
		return nil
	}

	format, _ := logformat.Parse(cfg.LogFormat) // cfg.Check accepted it
	logger := logformat.New(stderr, format, level(cfg.LogLevel))
	redis.SetLogger(agent.RedisLogger{Logger: logger})
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	cfg.DevCoordinator = startDevCoordinator // used under -dev without -coordinators
	srv, err := agent.Start(ctx, cfg, logger, nil)
	if err != nil {
		return err
	}
	srv.Registry.MustRegister(buildinfo.Collector())
	if cfg.Dev {
		fmt.Fprint(stdout, devGuide(srv.HTTPAddr(), srv.GRPCAddr(), cfg.CoordinatorAddrs()))
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-hup:
			if err := srv.Reload(); err != nil {
				logger.Error("reload on SIGHUP failed; previous rules stay in force", "err", err)
			}
		case <-ctx.Done():
			logger.Info("shutting down")
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
			defer cancel()
			return srv.Shutdown(sctx)
		}
	}
}

// devMode reports whether the command line (over RATION_DEV) turns -dev
// on, read as the flag package reads it, since the defaults it picks come
// before the flags: every boolean spelling (-dev, --dev, -dev=true,
// -dev=1, -dev=t, ...; -dev=false and -dev=0 turn it off), the last one
// winning, and not a -dev past the end of the flags or taken as another
// flag's value (-rules -dev). Errors are left to the real parse.
func devMode(args []string, lookup func(string) (string, bool)) bool {
	cfg := agent.DefaultConfig()
	_ = cfg.LoadEnv(lookup)
	fs, _ := newFlagSet(&cfg, io.Discard)
	_ = fs.Parse(args)
	return cfg.Dev
}

// newFlagSet is the command line: every setting of cfg (flags over the
// environment already loaded into it) and -version. docs/configuration.md
// lists the same flags (TestFlagDocs).
func newFlagSet(cfg *agent.Config, stderr io.Writer) (*flag.FlagSet, *bool) {
	fs := flag.NewFlagSet("gateway-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.BindFlags(fs)
	version := fs.Bool("version", false, buildinfo.FlagUsage)
	return fs, version
}

func level(s string) slog.Level {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

// devGuide is what -dev prints once it serves: commands to try against
// the agent's HTTP and gRPC addresses, and where its leases come from
// (the coordinators of -coordinators, or the node -dev embeds without
// them). Every command's outcome holds however fast it is typed: the
// rule+subject example names the same subject as the descriptors would
// (user=alice), and the 429 is promised within a refill's time.
func devGuide(httpAddr, grpcAddr string, coordinators []string) string {
	from := "the coordinator embedded in this process"
	if len(coordinators) > 0 {
		from = "the coordinators at " + strings.Join(coordinators, ",")
	}
	return fmt.Sprintf(`
Ration gateway-agent is running in -dev mode (in-memory store, sample rules).

  Decide (JSON):     curl -s -X POST http://%[1]s/v1/allow -d '{"descriptors":{"tenant":"acme","endpoint":"search"}}'
  Check (gateways):  curl -si 'http://%[1]s/v1/check?tenant=acme&endpoint=search'
                     (10 at once, then 1 a second: repeated, it answers 429
                     with Retry-After once the 10 are spent)
  By rule+subject:   curl -s -X POST http://%[1]s/v1/allow -d '{"rule":"per-user","subject":"user=alice","cost":5}'
                     (the subject as descriptors {"user":"alice"} name it:
                     the same quota; "alice" alone would be another one)
  Leased hot key:    curl -si 'http://%[1]s/v1/check?endpoint=checkout'
                     (decided in memory from a slice leased from %[3]s)
  Metrics:           curl -s http://%[1]s/metrics | grep ^ration_
  gRPC:              %[2]s (ration.v1.RateLimiter)

The sample rules are examples/rules.yaml; coordinator -dev runs with them too.
`, httpAddr, grpcAddr, from)
}
