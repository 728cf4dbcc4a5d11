package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/buildinfo"
)

func TestParseFlagsDefaults(t *testing.T) {
	cfg, err := parseFlags(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Mode != modeAllow || cfg.Concurrency != 64 || cfg.Duration != 10*time.Second || cfg.Warmup != time.Second ||
		cfg.Batch != 100 || cfg.ZipfS != 1.1 || cfg.DescriptorKey != "user" || cfg.Requests != 0 {
		t.Errorf("defaults = %+v", cfg)
	}
	if cfg.perCall() != 1 || cfg.workers() != 64 || cfg.connCount() != 4 {
		t.Errorf("perCall %d, workers %d, conns %d; want 1, 64, 4", cfg.perCall(), cfg.workers(), cfg.connCount())
	}
}

func TestParseFlagsGood(t *testing.T) {
	cfg, err := parseFlags(strings.Fields("-mode batch -batch 10 -target 127.0.0.1:1,[::1]:2,localhost:3 -mix a:3,b:1 "+
		"-rate 500 -max-outstanding 7 -duration 0 -requests 10 -pids 1,2"), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.perCall() != 10 || cfg.workers() != 7 || len(cfg.Targets) != 3 || len(cfg.Mix) != 2 || len(cfg.PIDs) != 2 {
		t.Errorf("config = %+v", cfg)
	}
	if cfg.connCount() != 4 {
		t.Errorf("connCount() = %d, want 4", cfg.connCount())
	}
	cfg.Concurrency, cfg.Rate, cfg.Conns = 1, 0, 0 // one worker, three targets: still one connection each
	if cfg.connCount() != 3 {
		t.Errorf("1 worker, 3 targets: connCount() = %d, want 3", cfg.connCount())
	}
	cfg.Concurrency, cfg.Conns = 64, 10
	if cfg.connCount() != 10 {
		t.Errorf("-conns 10: connCount() = %d, want 10", cfg.connCount())
	}
}

func TestParseFlagsBad(t *testing.T) {
	for _, c := range []struct {
		args string
		want []string // every problem is reported, not only the first
	}{
		{"-target 10.1.2.3:8081", []string{"only loopback"}},
		{"-target example.com:80", []string{"only loopback"}},
		{"-target 127.0.0.1", []string{"missing port"}},
		{"-mode http -http-target 192.168.1.1:80", []string{"only loopback"}},
		{"-mode bogus -dist nope -keys 0", []string{"-mode", "-dist", "-keys"}},
		{"-duration 0", []string{"never end"}},
		{"-zipf-s 1", []string{"-zipf-s"}},
		{"-batch 5", []string{"only -mode batch"}},
		{"-coalesce 1ms", []string{"for -mode client"}},
		{"-mode batch -batch 10001", []string{"-batch 10001"}},
		{"-rule a -mix b:1", []string{"-rule", "-mix"}},
		{"-mix a:0,b", []string{`"a:0"`, `"b"`}},
		{"-rule a -descriptors x=y", []string{"not both"}},
		{"-descriptors user=x", []string{"-descriptor-key"}},
		{"-rate 100 -concurrency 5", []string{"-max-outstanding"}},
		{"-max-outstanding 5", []string{"-rate"}},
		{"-pids 12,x", []string{`"x"`}},
		{"-cost 0 -timeout 0 -warmup -1s", []string{"-cost", "-timeout", "-warmup"}},
		{"extra", []string{"unexpected arguments"}},
		{"-nosuchflag", []string{"not defined"}},
	} {
		_, err := parseFlags(strings.Fields(c.args), &bytes.Buffer{})
		if err == nil {
			t.Errorf("parseFlags(%q) succeeded, want an error", c.args)
			continue
		}
		if !errors.Is(err, errUsage) || exitCode(err) != 2 {
			t.Errorf("parseFlags(%q) = %v: want a usage error (exit 2)", c.args, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("parseFlags(%q) = %q, want it to mention %q", c.args, err, w)
			}
		}
	}
}

func TestHelp(t *testing.T) {
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"-h"}, &bytes.Buffer{}, &stderr)
	if !errors.Is(err, flag.ErrHelp) || exitCode(err) != 0 {
		t.Errorf("-h: %v, exit %d; want flag.ErrHelp, exit 0", err, exitCode(err))
	}
	for _, w := range []string{"-mode", "-rate", "-pids", "coordinated omission", "loopback", "-tls-ca", "-listen-tls"} {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("-h output does not mention %q", w)
		}
	}
}

// -version prints the build and exits 0, whatever else the command line
// holds, and runs nothing.
func TestVersion(t *testing.T) {
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"-version", "-duration", "0"}, &stdout, &bytes.Buffer{}); err != nil {
		t.Fatalf("-version: %v", err)
	}
	if want := "ration-bench " + buildinfo.Get().String() + "\n"; stdout.String() != want {
		t.Fatalf("-version printed %q, want %q", stdout.String(), want)
	}
}

func TestCheckLoopback(t *testing.T) {
	for addr, ok := range map[string]bool{
		"127.0.0.1:80": true, "127.9.9.9:80": true, "[::1]:80": true, "localhost:80": true, "[::ffff:127.0.0.1]:80": true,
		"0.0.0.0:80": false, "[::]:80": false, "10.0.0.1:80": false, "8.8.8.8:53": false, "localhost.example:80": false,
		"127.0.0.1:0": false, "127.0.0.1:x": false,
	} {
		if err := checkLoopback(addr); (err == nil) != ok {
			t.Errorf("checkLoopback(%q) = %v, want ok=%v", addr, err, ok)
		}
	}
}
