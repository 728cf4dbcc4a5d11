package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
)

// Against a group whose nodes share an admin token file, the commands
// work with -token-file (tune through a follower too: the token goes with
// the redirected call) and are refused UNAUTHENTICATED without it.
func TestCommandsWithAdminToken(t *testing.T) {
	file, _ := harness.AdminToken(t)
	c := harness.StartCoordinators(t, 3, string(devRules), func(cfg *coordinator.Config) { cfg.AdminTokenFile = file })
	li, _ := c.Leader(t)
	follower := c.Node((li + 1) % 3).AdminAddr()
	var out bytes.Buffer
	err := run(context.Background(), []string{"status", "-addr", follower}, &out, &bytes.Buffer{}, noEnv)
	if err == nil || !strings.Contains(err.Error(), "Unauthenticated") {
		t.Errorf("status without -token-file: %v, want Unauthenticated", err)
	}
	err = run(context.Background(), []string{"tune", "-addr", follower, "-rule", "export-global", "-weight", "2"}, &out, &bytes.Buffer{}, noEnv)
	if err == nil || !strings.Contains(err.Error(), "Unauthenticated") {
		t.Errorf("tune without -token-file: %v, want Unauthenticated", err)
	}
	out.Reset()
	if err := run(context.Background(), []string{"tune", "-addr", follower, "-token-file", file, "-rule", "export-global", "-weight", "2"}, &out, &bytes.Buffer{}, noEnv); err != nil {
		t.Fatalf("tune through a follower with -token-file: %v", err)
	}
	if !regexp.MustCompile(`export-global\s+-\s+-\s+-\s+-\s+-\s+2`).MatchString(out.String()) {
		t.Errorf("tune printed %q, want the new tuning", out.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"members", "list", "-addr", follower, "-token-file", file}, &out, &bytes.Buffer{}, noEnv); err != nil || !strings.Contains(out.String(), "leader") {
		t.Errorf("members list with -token-file: %v\n%s", err, out.String())
	}
}

// Every command asks the node's admin listener, at the node's default
// -admin address unless -addr says otherwise.
func TestCommandsDefaultToTheAdminPort(t *testing.T) {
	def := coordinator.DefaultConfig()
	if defaultAdminAddr != def.AdminAddr || def.AdminAddr == def.GRPCAddr {
		t.Fatalf("commands default to %s; the node's admin listener defaults to %s (lease port %s)", defaultAdminAddr, def.AdminAddr, def.GRPCAddr)
	}
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addr, _, _ := bindAddr(fs)
	if *addr != def.AdminAddr {
		t.Errorf("-addr defaults to %s, want %s", *addr, def.AdminAddr)
	}
	if fs.Lookup("token-file") == nil {
		t.Error("no -token-file flag")
	}
}
