// Command ration-sim runs the deterministic simulation of Ration's lease
// protocol (internal/sim): many agents in many regions, a coordinator group
// per region and a global one, simulated time, network, clocks and faults.
// One seed is one exact run; the report says whether every leased quota
// stayed within its bound, how well budgets were used, how fast shares
// followed demand and what each coordinator group carried.
//
//	ration-sim -config small -seed 7
//	ration-sim -config reference -seed 1 -out docs/images/sim
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"

	"github.com/ration-dev/ration/internal/sim"
)

func main() {
	// The reference run holds ~1 GB of live state (10,000 holders, every
	// group's leases, the recorded admissions): collecting at 4x that
	// instead of 2x trades memory this tool can spare for ~5% of its time.
	debug.SetGCPercent(400)
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ration-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "small", "the run: small (4 regions x 25 agents, 90s simulated) or reference (20 regions x 500 agents, 1,000,000 decisions/s on average, 10 min)")
	seed := fs.Uint64("seed", 1, "the seed: one seed is one exact run")
	out := fs.String("out", "", "directory to write the plots (SVG) and the report into; empty: the report on stdout only")
	duration := fs.Duration("duration", 0, "simulated time, instead of the configuration's (the fault schedule scales with it)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
	faults := fs.Bool("faults", true, "inject the fault schedule (partitions, leader crashes, agent crashes, a region going dark, a flash crowd)")
	nudges := fs.Bool("nudges", false, "model the regional leaders' nudges (their planner, as internal/coordinator's, and Watch streams); off: holders renew at their renew points")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ration-sim: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	var cfg sim.Config
	switch *config {
	case "small":
		cfg = sim.Small()
	case "reference":
		cfg = sim.Reference()
	default:
		fmt.Fprintf(stderr, "ration-sim: -config %q: want small or reference\n", *config)
		return 2
	}
	cfg.Seed, cfg.Faults, cfg.Nudges = *seed, *faults, *nudges
	if *duration > 0 {
		cfg.Duration = *duration
	}
	s, err := sim.New(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "ration-sim: %v\n", err)
		return 2
	}
	s.Progress = stderr
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintf(stderr, "ration-sim: %v\n", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "ration-sim: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := s.Run()
	if err != nil {
		fmt.Fprintf(stderr, "ration-sim: %v\n", err)
		return 1
	}
	rep.Text(stdout)
	fmt.Fprintln(stderr, rep.Timing())
	if *out != "" {
		if err := write(*out, rep); err != nil {
			fmt.Fprintf(stderr, "ration-sim: %v\n", err)
			return 1
		}
	}
	if !rep.OK() {
		return 1
	}
	return 0
}

func write(dir string, rep *sim.Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var errs []error
	for name, fn := range map[string]func(io.Writer) error{
		"report.txt":   func(w io.Writer) error { rep.Text(w); return nil },
		"admitted.svg": rep.AdmittedSVG,
		"load.svg":     rep.LoadSVG,
	} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := fn(f); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		if err := f.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
