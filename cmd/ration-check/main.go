// Command ration-check replays the admission logs that agents write under
// -record through a leaky bucket per quota and reports, for each, the
// largest overshoot in tokens, the window where it happened, the
// utilisation and whether it stayed within its bound.
//
//	ration-check agent1.log agent2.log             # bound 0 for every quota
//	ration-check -bound 'per-user|alice=40' -default-bound 0 *.log
//	ration-check -version
//
// The logs of several agents on one host merge: their timestamps are
// CLOCK_MONOTONIC. Exit status 1 when a quota went over its bound.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/buildinfo"
)

func main() {
	ok, err := run(os.Args[1:], os.Stdout, os.Stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "ration-check:", err)
		}
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

type bounds map[string]float64

func (b bounds) String() string { return fmt.Sprint(map[string]float64(b)) }

func (b bounds) Set(s string) error {
	q, v, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("%q: want QUOTA=TOKENS", s)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 {
		return fmt.Errorf("%q: bound must be a number >= 0", s)
	}
	b[q] = f
	return nil
}

func run(args []string, stdout, stderr io.Writer) (bool, error) {
	fs := flag.NewFlagSet("ration-check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	per := bounds{}
	fs.Var(per, "bound", "QUOTA=TOKENS: the overshoot a quota may show (repeatable; QUOTA is rule|subject)")
	def := fs.Float64("default-bound", 0, "bound for quotas without -bound (0: leased or fail_closed)")
	version := fs.Bool("version", false, buildinfo.FlagUsage)
	if err := fs.Parse(args); err != nil {
		return false, err
	}
	if *version {
		buildinfo.Print(stdout, "ration-check")
		return true, nil
	}
	if fs.NArg() == 0 {
		return false, errors.New("no admission logs given (see -h)")
	}
	var recs []admission.Record
	for _, name := range fs.Args() {
		f, err := os.Open(name)
		if err != nil {
			return false, err
		}
		rs, err := admission.Read(f)
		f.Close()
		if err != nil {
			return false, fmt.Errorf("%s: %w", name, err)
		}
		recs = append(recs, rs...)
	}
	admission.Sort(recs)
	var vs []admission.Verdict
	for _, rep := range admission.CheckAll(recs) {
		b, ok := per[rep.Quota]
		if !ok {
			b = *def
		}
		vs = append(vs, admission.Judge(rep, b))
	}
	fmt.Fprint(stdout, admission.Table(vs))
	for _, v := range vs {
		if !v.Pass {
			return false, nil
		}
	}
	return true, nil
}
