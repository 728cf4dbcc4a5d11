package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
)

// startAgent runs a -dev gateway-agent (in-memory store, sample rules) in
// this process on free loopback ports; opts adjust its configuration.
func startAgent(t testing.TB, opts ...func(*agent.Config)) *agent.Server {
	t.Helper()
	cfg := agent.DevConfig()
	cfg.HTTPAddr, cfg.GRPCAddr = "127.0.0.1:0", "127.0.0.1:0"
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := agent.Start(context.Background(), cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatalf("agent.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	for deadline := time.Now().Add(5 * time.Second); !srv.Ready(); {
		if time.Now().After(deadline) {
			t.Fatal("agent not ready after 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return srv
}

// TestRunAgainstAgent runs every mode, closed and open loop, for a short
// bounded run and checks that the report's counts add up.
func TestRunAgainstAgent(t *testing.T) {
	srv := startAgent(t)
	g, h := srv.GRPCAddr(), srv.HTTPAddr()
	// -timeout 30s: the counts are checked, not the agent's latency. A
	// CI run saw every batch call of one run pass the 5s default beside
	// the other packages' tests (the -dev agent's first grants wait on
	// its embedded coordinator's disk writes).
	short := "-duration 300ms -warmup 100ms -concurrency 8 -keys 50 -timeout 30s -json"
	for _, c := range []struct {
		name string
		args string
		// requests: the exact decision count when capped
		requests int64
	}{
		{"empty", "-mode empty -target " + g + " " + short, 0},
		{"allow descriptors", "-mode allow -target " + g + " " + short, 0},
		{"allow rule zipf", "-mode allow -rule per-user -dist zipf -target " + g + " " + short, 0},
		{"allow mix hot", "-mode allow -mix per-user:3,tenant-search:1 -dist hot -target " + g + " " + short, 0},
		{"batch", "-mode batch -batch 20 -target " + g + " " + short, 0},
		{"batch capped", "-mode batch -batch 20 -target " + g + " -duration 0 -requests 1010 -warmup 0 -timeout 30s -json", 1010},
		{"stream", "-mode stream -target " + g + "," + g + " " + short, 0},
		{"http check", "-mode http -http-target " + h + " " + short, 0},
		{"envoy", "-mode envoy -target " + g + " " + short, 0},
		{"go client coalescing", "-mode client -target " + g + " " + short, 0},
		{"go client unary", "-mode client -coalesce -1ns -target " + g + " " + short, 0},
		{"http allow", "-mode http -rule per-user -http-target " + h + " " + short, 0},
		{"open loop", "-mode allow -rate 2000 -max-outstanding 16 -target " + g + " -duration 300ms -warmup 100ms -keys 50 -timeout 30s -json", 0},
		{"open loop batch capped", "-mode batch -batch 10 -rate 5000 -max-outstanding 4 -target " + g + " -duration 2s -requests 205 -timeout 30s -json", 205},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if err := run(context.Background(), strings.Fields(c.args), &stdout, &stderr); err != nil {
				t.Fatalf("run: %v\nstderr: %s", err, stderr.String())
			}
			var r Report
			if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
				t.Fatalf("report is not JSON: %v\n%s", err, stdout.String())
			}
			checkCounts(t, r)
			if r.Errors != 0 {
				t.Errorf("%d errors: %v", r.Errors, r.ErrorsByReason)
			}
			if c.requests > 0 && r.Decisions != c.requests {
				t.Errorf("-requests %d: %d decisions measured", c.requests, r.Decisions)
			}
			if r.Mode == modeEmpty && r.AllowedByReason["serving"] != r.Decisions {
				t.Errorf("empty: allowed by reason %v, want every decision serving", r.AllowedByReason)
			}
			if r.Mode != modeEmpty && r.AllowedByReason["no_rule"] != 0 {
				t.Errorf("%d decisions matched no rule: the requests miss the dev rules", r.AllowedByReason["no_rule"])
			}
			if stderr.Len() != 0 {
				t.Errorf("stderr is not a terminal, yet got %q", stderr.String())
			}
		})
	}
}

// checkCounts holds a report to its own arithmetic.
func checkCounts(t *testing.T, r Report) {
	t.Helper()
	if r.Decisions == 0 || r.Calls == 0 {
		t.Fatalf("measured %d decisions in %d calls, want some", r.Decisions, r.Calls)
	}
	if sum := r.Allowed + r.Denied + r.Errors; sum != r.Decisions {
		t.Errorf("allowed %d + denied %d + errors %d = %d, want decisions %d", r.Allowed, r.Denied, r.Errors, sum, r.Decisions)
	}
	for _, c := range []struct {
		name  string
		total int64
		by    map[string]int64
	}{{"allowed", r.Allowed, r.AllowedByReason}, {"denied", r.Denied, r.DeniedByReason}, {"errors", r.Errors, r.ErrorsByReason}} {
		var sum int64
		for _, v := range c.by {
			sum += v
		}
		if sum != c.total {
			t.Errorf("%s by reason %v adds up to %d, want %d", c.name, c.by, sum, c.total)
		}
	}
	// Calls carry Batch decisions each, except a -requests cap may cut the last.
	if full := r.Calls * int64(r.Batch); r.Decisions > full || r.Decisions <= full-int64(r.Batch) {
		t.Errorf("%d decisions in %d calls of %d", r.Decisions, r.Calls, r.Batch)
	}
	if r.Latency.Count != r.Calls {
		t.Errorf("latency histogram holds %d calls, want %d", r.Latency.Count, r.Calls)
	}
	if r.Batch > 1 {
		if r.Amortized == nil || r.Amortized.Count != r.Decisions {
			t.Errorf("amortized latency %+v, want %d decisions", r.Amortized, r.Decisions)
		}
	} else if r.Amortized != nil {
		t.Errorf("amortized latency reported for batch size %d", r.Batch)
	}
	l := r.Latency
	if !(0 < l.P50 && l.P50 <= l.P90 && l.P90 <= l.P95 && l.P95 <= l.P99 && l.P99 <= l.P999 && l.P999 <= l.Max) {
		t.Errorf("percentiles out of order: %+v", l)
	}
	var fp int64
	for _, m := range []map[string]int64{r.AllowedByReason, r.DeniedByReason} {
		fp += m["unavailable"] + m["emergency"]
	}
	if fp != r.FailurePolicy || r.NoRule != r.AllowedByReason["no_rule"] {
		t.Errorf("failure_policy %d, no_rule %d; by reason %v %v", r.FailurePolicy, r.NoRule, r.AllowedByReason, r.DeniedByReason)
	}
	if r.DecidedPerSec > r.DecisionsPerSec {
		t.Errorf("decided/s %v > decisions/s %v", r.DecidedPerSec, r.DecisionsPerSec)
	}
	if r.ElapsedSeconds <= 0 || r.DecisionsPerSec <= 0 {
		t.Errorf("elapsed %vs, %v decisions/s: want both positive", r.ElapsedSeconds, r.DecisionsPerSec)
	}
	if r.Loop == "open" {
		if r.OpenLoop == nil || r.OpenLoop.Sent != r.Decisions {
			t.Errorf("open loop: %+v, want sent = %d decisions", r.OpenLoop, r.Decisions)
		}
	}
	if r.SelfCPU == nil {
		t.Error("no CPU figure for the tool itself")
	}
}

func TestRunTextReportAndPIDs(t *testing.T) {
	srv := startAgent(t)
	var stdout, stderr bytes.Buffer
	args := []string{"-target", srv.GRPCAddr(), "-duration", "200ms", "-warmup", "0", "-concurrency", "4", "-pids", "1"}
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	for _, w := range []string{"decisions", "allowed", "p99.9", "per decision", "CPU in the window", "ration-bench (this tool)"} {
		if !strings.Contains(stdout.String(), w) {
			t.Errorf("text report lacks %q:\n%s", w, stdout.String())
		}
	}
}

func TestRunUnreachable(t *testing.T) {
	// A port that was free a moment ago: nothing listens there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	for _, args := range [][]string{
		{"-target", addr, "-duration", "1s"},
		{"-mode", "http", "-http-target", addr, "-duration", "1s"},
	} {
		err := run(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{})
		if !errors.Is(err, errUnreachable) || exitCode(err) != 1 || !strings.Contains(err.Error(), addr) {
			t.Errorf("run(%q) = %v (exit %d), want unreachable naming %s, exit 1", args, err, exitCode(err), addr)
		}
	}
}

// An interrupted run still reports what it measured and says so.
func TestRunInterrupted(t *testing.T) {
	srv := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var stdout bytes.Buffer
	args := []string{"-target", srv.GRPCAddr(), "-duration", "1m", "-warmup", "0", "-concurrency", "4", "-json"}
	if err := run(ctx, args, &stdout, &bytes.Buffer{}); !errors.Is(err, errInterrupted) || exitCode(err) != 130 {
		t.Fatalf("run = %v (exit %d), want interrupted (exit 130)", err, exitCode(err))
	}
	var r Report
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if !r.Interrupted {
		t.Error("report does not say it was interrupted")
	}
	checkCounts(t, r)
}
