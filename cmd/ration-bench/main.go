// Command ration-bench is the load tool for gateway-agents: it drives one
// or more agents over gRPC (Allow, AllowBatch, AllowStream, or the empty
// Health/Check as the floor) or HTTP (GET /v1/check), closed loop at a fixed
// concurrency or open loop at a fixed rate, and reports decisions per
// second, outcomes by reason, latency percentiles from an HDR histogram and
// the CPU that given processes spent per decision.
//
//	ration-bench -mode allow -target 127.0.0.1:8081 -keys 10000 -duration 10s
//	ration-bench -mode batch -batch 100 -dist zipf -pids 1234,5678 -json
//	ration-bench -mode http -http-target 127.0.0.1:8080 -rate 5000
//	ration-bench -mode allow -tls-ca certs/ca.crt -tls-cert certs/gateway-dev.crt -tls-key certs/gateway-dev.key
//	ration-bench plan -decisions 1000000 -leased-share 0.2 -gateways 200 -lease-period 10s -headroom 0.3
//	ration-bench -version
//
// The plan subcommand sizes Redis shards, agent cores and coordinator
// nodes for a decision rate and traffic mix from the per-decision costs
// scripts/bench.sh measures (docs/capacity.md).
//
// An agent serving TLS (-listen-tls, -listen-client-auth) is dialed with
// -tls-ca, -tls-cert and -tls-key. Only loopback targets are accepted. Every run is bounded by -duration
// and/or -requests. scripts/bench.sh runs the reference matrix and writes
// docs/performance.md. See -h for every flag.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/ration-dev/ration/internal/buildinfo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "ration-bench:", err)
		}
		os.Exit(exitCode(err))
	}
}

var (
	// errAllFailed: the run completed but not one decision succeeded.
	errAllFailed = errors.New("every decision failed")
	// errInterrupted: a signal stopped the run; the report covers what was
	// measured until then.
	errInterrupted = errors.New("interrupted")
)

func exitCode(err error) int {
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	case errors.Is(err, errInterrupted):
		return 130
	default:
		return 1
	}
}

// run parses args, runs the benchmark and writes the report to stdout.
// Progress goes to stderr once a second when stderr is a terminal.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "plan" {
		return runPlan(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "protoset" {
		return runProtoset(args[1:], stdout, stderr)
	}
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, errVersion) {
		buildinfo.Print(stdout, "ration-bench")
		return nil
	}
	if err != nil {
		return err
	}
	var progress io.Writer
	if isTerminal(stderr) {
		progress = stderr
	}
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	r, err := bench(ctx, cfg, progress)
	if err != nil {
		return err
	}
	if cfg.JSON {
		err = r.writeJSON(stdout)
	} else {
		err = r.writeText(stdout)
	}
	if err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	if r.Interrupted {
		return fmt.Errorf("%w after %.1fs measured: the report covers that much", errInterrupted, r.ElapsedSeconds)
	}
	if r.Decisions > 0 && r.Errors == r.Decisions {
		return fmt.Errorf("%w (%d errors: %s)", errAllFailed, r.Errors, byReason(r.ErrorsByReason))
	}
	return nil
}

// bench runs one benchmark described by cfg (already checked).
func bench(ctx context.Context, cfg Config, progress io.Writer) (*Report, error) {
	cpu, err := newCPUWatch(cfg.PIDs)
	if err != nil {
		return nil, err
	}
	d, err := dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer d.close()
	if progress != nil {
		for _, n := range d.notes {
			fmt.Fprintln(progress, "note:", n)
		}
	}

	r := newReport(cfg, d)
	e := newEngine(cfg, d)
	finished := e.run(ctx, progress, cpu.start)
	r.StartedAt = e.start.UTC().Format(time.RFC3339)
	r.Interrupted = ctx.Err() != nil
	if cfg.Rate > 0 {
		r.OpenLoop = &openLoop{Sent: e.sent.Load(), Unsent: e.unsent.Load()}
	}
	t := merge(e.shards)
	r.fill(t, max(0, finished.Sub(e.measureStart)))
	r.CPU, r.SelfCPU = cpu.finish(t.decisions)
	for _, c := range r.CPU {
		r.CPUTotalUSPerDecision += c.USPerDecision
	}
	r.CPUTotalUSPerDecision = round1(r.CPUTotalUSPerDecision)
	return r, nil
}

// isTerminal reports whether w is a character device (a terminal), so
// progress lines are not written into files and pipes.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
