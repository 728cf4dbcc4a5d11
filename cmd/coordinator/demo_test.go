package main

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The local multi-region topology (deploy/local/demo-regions.sh: a 3-node
// global group, two regions each with redis-server, a regional coordinator
// and two agents, all real processes) in its --check mode: it drives the
// global leased rule from all four agents and ration-check replays every
// admission against B + r*T. It builds the binaries, so it is skipped
// under -short.
func TestDemoRegionsScript(t *testing.T) {
	script := demoScript(t, "builds and runs 11 processes; skipped under -short")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script, "--check", "8")
	// On timeout the script gets SIGTERM, so its trap stops what it started.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	dir := t.TempDir()
	cmd.Env = demoEnv(dir)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		for _, f := range []string{"global0", "coordinator-eu", "eu-a1"} {
			if b, rerr := os.ReadFile(filepath.Join(dir, "logs", f+".log")); rerr == nil {
				t.Logf("%s.log:\n%s", f, b)
			}
		}
		t.Fatalf("demo-regions.sh --check: %v", err)
	}
	if !strings.Contains(string(out), "global-api|x0") || !strings.Contains(string(out), " ok ") {
		t.Fatalf("ration-check did not report global-api|x0 as ok")
	}
	// The demo runs the secure path: certificates of its own CA, and no
	// process in plaintext.
	if _, err := os.Stat(filepath.Join(dir, "certs", "ca.crt")); err != nil {
		t.Errorf("the demo made no CA: %v", err)
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, f := range logs {
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), "PLAINTEXT") {
			t.Errorf("%s: a process of the demo ran in plaintext", filepath.Base(f))
		}
	}
}

// demoScript is deploy/local/demo-regions.sh's path, the test skipped
// (saying why) under -short or when a tool the script needs is missing.
func demoScript(t *testing.T, short string) string {
	t.Helper()
	if testing.Short() {
		t.Skip(short)
	}
	for _, bin := range []string{"bash", "redis-server", "curl", "go"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	script, err := filepath.Abs("../../deploy/local/demo-regions.sh")
	if err != nil {
		t.Fatal(err)
	}
	return script
}

// demoEnv is the script's environment: its logs and binaries in dir, and
// its fixed ports (BASE_PORT..+60) below the kernel's ephemeral range
// (32768 up on Linux), where no other test's listener on port 0 or
// outgoing connection can land first.
func demoEnv(dir string) []string {
	return append(os.Environ(), "BASE_PORT="+strconv.Itoa(20000+rand.IntN(250)*50), "DEMO_DIR="+dir)
}
