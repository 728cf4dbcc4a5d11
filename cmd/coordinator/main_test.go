package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/buildinfo"
	"github.com/ration-dev/ration/internal/harness"
)

func noEnv(string) (string, bool) { return "", false }

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, devRules, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("rules:\n  - name: x\n    burst: -1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		wantErr  string // "" = success
		wantCode int
		wantOut  string
	}{
		{"valid", []string{"-validate", "-rules", good, "-data-dir", dir, "-insecure"}, "", 0, "3 leased"},
		{"example rules", []string{"-validate", "-rules", exampleRules, "-data-dir", dir, "-insecure"}, "", 0, "3 leased"},
		// Checking a rules file needs no TLS (docs/runbook.md runs it so):
		// the missing files are a note, not a refusal...
		{"validate needs no TLS", []string{"-validate", "-rules", good}, "", 0, "note: to run, a node also needs TLS files or -insecure"},
		// ...but TLS flags given are still checked.
		{"validate checks half a TLS set", []string{"-validate", "-rules", good, "-tls-cert", "a.crt"}, "missing [-tls-key -tls-ca]", 2, ""},
		{"admin on the lease port", []string{"-validate", "-rules", good, "-data-dir", dir, "-insecure", "-admin", "127.0.0.1:8301"},
			`-grpc and -admin are both "127.0.0.1:8301"`, 2, ""},
		{"invalid rules", []string{"-validate", "-rules", bad, "-data-dir", dir}, "rules file is invalid", 1, ""},
		{"missing rules", []string{"-validate", "-data-dir", dir}, "-rules", 2, ""},
		{"bad flags named", []string{"-validate", "-rules", good, "-data-dir", "", "-tick", "0s"}, "-tick", 2, ""},
		{"dev is valid", []string{"-dev", "-validate"}, "", 0, "configuration valid"},
		{"dev=1 is valid", []string{"-dev=1", "-validate"}, "", 0, "configuration valid"},
		{"--dev=t is valid", []string{"--dev=t", "-validate"}, "", 0, "configuration valid"},
		{"dev=false is not dev", []string{"-dev", "-dev=false", "-validate"}, "-rules", 2, ""},
		{"log format json", []string{"-dev", "-validate", "-log-format", "json"}, "", 0, "configuration valid"},
		{"log format refused", []string{"-dev", "-validate", "-log-format", "xml", "-tick", "0s"}, `-log-format "xml": want text or json`, 2, ""},
		{"stray argument", []string{"-dev", "-validate", "--", "x"}, "unexpected arguments", 2, ""},
		{"unknown command", []string{"frobnicate"}, "unknown command", 2, ""},
		{"version", []string{"-version"}, "", 0, "coordinator " + buildinfo.Get().String() + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run(context.Background(), tc.args, &out, &errb, noEnv)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("run(%q) = %v (stderr %s)", tc.args, err, errb.String())
				}
				if !strings.Contains(out.String(), tc.wantOut) {
					t.Errorf("stdout %q, want %q", out.String(), tc.wantOut)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("run(%q) = %v, want an error mentioning %q", tc.args, err, tc.wantErr)
			}
			if got := exitCode(err); got != tc.wantCode {
				t.Errorf("exit code %d, want %d", got, tc.wantCode)
			}
		})
	}
}

// exampleRules is examples/rules.yaml, which gateway-agent -dev runs with.
const exampleRules = "../../examples/rules.yaml"

// -dev runs with examples/rules.yaml, as gateway-agent -dev does (its test
// holds it to the same file), so an agent under -dev pointed at this
// node knows the same leased rules.
func TestDevRulesAreTheExample(t *testing.T) {
	b, err := os.ReadFile(exampleRules)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(devRules, b) {
		t.Fatalf("-dev does not run with %s", exampleRules)
	}
}

// -h names every operator command with its flags, and each command's own
// -h works.
func TestUsageNamesEveryCommand(t *testing.T) {
	var stderr bytes.Buffer
	if err := run(context.Background(), []string{"-h"}, &bytes.Buffer{}, &stderr, noEnv); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h = %v, want flag.ErrHelp", err)
	}
	for _, c := range commands {
		shown := "coordinator " + c + " -addr HOST:PORT"
		if c == "members" {
			shown = "coordinator members list -addr HOST:PORT"
		}
		if !strings.Contains(stderr.String(), shown) {
			t.Errorf("-h does not show the command %q:\n%s", c, stderr.String())
		}
		var cmdHelp bytes.Buffer
		if err := run(context.Background(), []string{c, "-h"}, &bytes.Buffer{}, &cmdHelp, noEnv); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s -h = %v, want flag.ErrHelp", c, err)
		}
		// Every flag of the command is in the usage line of tune (the
		// others take only -addr, -timeout and -quota).
		if c == "tune" {
			fs := flag.NewFlagSet("tune", flag.ContinueOnError)
			var tf tuneFlags
			tf.bind(fs)
			fs.VisitAll(func(f *flag.Flag) {
				if !strings.Contains(stderr.String(), "-"+f.Name+" ") && !strings.Contains(stderr.String(), "-"+f.Name+"]") {
					t.Errorf("-h does not show tune's flag -%s", f.Name)
				}
			})
		}
	}
	err := run(context.Background(), []string{"frobnicate"}, &bytes.Buffer{}, &bytes.Buffer{}, noEnv)
	if err == nil || !strings.Contains(err.Error(), "status, quotas, leases, tune, tunings or members") {
		t.Errorf("unknown command: %v, want every command named", err)
	}
}

// TestDevAndCommands runs `coordinator -dev=1` on free ports (a node that
// bootstraps itself: -dev's defaults, whatever the spelling), asks it for
// its status, quotas and leases with the operator commands, then stops it
// as SIGTERM would.
func TestDevAndCommands(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr harness.LogBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-dev=1", "-raft", "127.0.0.1:0", "-grpc", "127.0.0.1:0", "-http", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-log-level", "warn"},
			&bytes.Buffer{}, &stderr, noEnv)
	}()
	// The commands go to the admin listener, which -dev names.
	re := regexp.MustCompile(`gRPC (\S+), HTTP (\S+), admin (\S+),`)
	var addr, httpAddr string
	deadline := time.Now().Add(30 * time.Second)
	for addr == "" {
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			addr, httpAddr = m[3], m[2]
			break
		}
		select {
		case err := <-done:
			t.Fatalf("coordinator -dev exited: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("coordinator -dev did not start:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The leader serves once LeaderElected is applied; status shows it.
	var out bytes.Buffer
	for {
		out.Reset()
		if err := run(ctx, []string{"status", "-addr", addr}, &out, &bytes.Buffer{}, noEnv); err != nil {
			t.Fatalf("status: %v", err)
		}
		if strings.Contains(out.String(), "Leader") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed a leader:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, cmd := range [][]string{{"quotas", "-addr", addr}, {"leases", "-addr", addr, "-quota", "x|y"}} {
		out.Reset()
		if err := run(ctx, cmd, &out, &bytes.Buffer{}, noEnv); err != nil {
			t.Fatalf("%s: %v", cmd[0], err)
		}
		if !strings.Contains(out.String(), "QUOTA") {
			t.Errorf("%s printed %q, want a table header", cmd[0], out.String())
		}
	}
	// tune sets one knob; tunings and status show it; a bad one is refused
	// naming the field.
	out.Reset()
	if err := run(ctx, []string{"tune", "-addr", addr, "-rule", "export-global", "-max-slice", "7", "-lease-period", "3s"}, &out, &bytes.Buffer{}, noEnv); err != nil {
		t.Fatalf("tune: %v", err)
	}
	for _, cmd := range [][]string{{"tunings", "-addr", addr}, {"status", "-addr", addr}} {
		out.Reset()
		if err := run(ctx, cmd, &out, &bytes.Buffer{}, noEnv); err != nil {
			t.Fatalf("%s: %v", cmd[0], err)
		}
		if !regexp.MustCompile(`export-global\s+-\s+3s\s+-\s+-\s+7\s+-`).MatchString(out.String()) {
			t.Errorf("%s printed %q, want the tuning of export-global (3s, max slice 7)", cmd[0], out.String())
		}
	}
	err := run(ctx, []string{"tune", "-addr", addr, "-rule", "export-global", "-renew-at", "2"}, &out, &bytes.Buffer{}, noEnv)
	if err == nil || !strings.Contains(err.Error(), "renew_at 2") {
		t.Errorf("tune -renew-at 2 = %v, want an error naming renew_at", err)
	}
	if err := run(ctx, []string{"status", "-addr", addr, "-timeout", "x"}, &out, &bytes.Buffer{}, noEnv); err == nil {
		t.Error("status with a bad -timeout succeeded")
	}
	checkBuildInfo(t, "http://"+httpAddr+"/metrics")
	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("coordinator -dev returned %v on shutdown", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("coordinator -dev did not stop")
	}
}

// tune sent to a follower's admin listener is redirected to the leader's
// admin address (not its lease port, which would answer UNIMPLEMENTED) and
// committed there; tune sent to a lease port is refused, naming -admin.
func TestTuneThroughFollower(t *testing.T) {
	c := harness.StartCoordinators(t, 3, string(devRules))
	li, ln := c.Leader(t)
	fn := c.Node((li + 1) % 3)
	// The follower knows the leader's admin address (from the member
	// table), so its first answer redirects.
	deadline := time.Now().Add(10 * time.Second)
	for _, admin := fn.LeaderAdmin(); admin != ln.AdminAddr(); _, admin = fn.LeaderAdmin() {
		if time.Now().After(deadline) {
			t.Fatalf("the follower does not know the leader's admin address %s", ln.AdminAddr())
		}
		time.Sleep(10 * time.Millisecond)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"tune", "-addr", fn.AdminAddr(), "-rule", "export-global", "-min-slice", "2"}, &out, &bytes.Buffer{}, noEnv); err != nil {
		t.Fatalf("tune through a follower: %v", err)
	}
	if !regexp.MustCompile(`export-global\s+-\s+-\s+-\s+2\s`).MatchString(out.String()) {
		t.Errorf("tune printed %q, want the new tuning", out.String())
	}
	err := run(context.Background(), []string{"tune", "-addr", fn.GRPCAddr(), "-rule", "export-global", "-weight", "3"}, &out, &bytes.Buffer{}, noEnv)
	if err == nil || !strings.Contains(err.Error(), "Unimplemented") || !strings.Contains(err.Error(), "-admin listener") {
		t.Errorf("tune at a lease port: %v, want Unimplemented naming the -admin listener", err)
	}
}

// devMode reads -dev as the flag package does: every boolean spelling,
// the last one winning, over RATION_DEV; not past the end of the flags,
// nor as another flag's value.
func TestDevMode(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string // RATION_DEV; "" = unset
		want bool
	}{
		{nil, "", false},
		{[]string{"-dev"}, "", true},
		{[]string{"--dev"}, "", true},
		{[]string{"-dev=true"}, "", true},
		{[]string{"--dev=true"}, "", true},
		{[]string{"-dev=1"}, "", true},
		{[]string{"-dev=t"}, "", true},
		{[]string{"-dev=T"}, "", true},
		{[]string{"-dev=TRUE"}, "", true},
		{[]string{"-dev=True"}, "", true},
		{[]string{"--dev=1"}, "", true},
		{[]string{"-dev=false"}, "", false},
		{[]string{"-dev=0"}, "", false},
		{[]string{"-dev=f"}, "", false},
		{[]string{"-dev=F"}, "", false},
		{[]string{"-dev=FALSE"}, "", false},
		{[]string{"--dev=False"}, "", false},
		{[]string{"-dev", "-dev=false"}, "", false},
		{[]string{"-dev=false", "-dev"}, "", true},
		{[]string{"-raft", "127.0.0.1:0", "-dev", "-grpc", "127.0.0.1:0"}, "", true},
		{[]string{"-log-format", "json", "-dev"}, "", true},
		{[]string{"-rules", "-dev"}, "", false}, // a rules file named -dev
		{[]string{"-id=n1", "-dev"}, "", true},  // -name=value takes no next argument
		{[]string{"--", "-dev"}, "", false},     // past the end of the flags
		{[]string{"-dev=yes"}, "", false},       // not a boolean: the real parse refuses it
		{[]string{"-bogus", "-dev"}, "", false}, // stops at the unknown flag, which the real parse reports
		{nil, "1", true},
		{nil, "t", true},
		{nil, "TRUE", true},
		{nil, "false", false},
		{nil, "yes", false}, // malformed: reported after parsing
		{[]string{"-dev=false"}, "true", false},
		{[]string{"-dev"}, "0", true},
	} {
		lookup := func(k string) (string, bool) { return tc.env, tc.env != "" && k == "RATION_DEV" }
		if got := devMode(tc.args, lookup); got != tc.want {
			t.Errorf("devMode(%q, RATION_DEV=%q) = %v, want %v", tc.args, tc.env, got, tc.want)
		}
	}
}

// RATION_LOG_FORMAT sets -log-format like any other variable, and a
// malformed one is refused with the other problems.
func TestLogFormatEnv(t *testing.T) {
	env := func(k string) (string, bool) { return "yaml", k == "RATION_LOG_FORMAT" }
	err := run(context.Background(), []string{"-dev", "-validate"}, &bytes.Buffer{}, &bytes.Buffer{}, env)
	if err == nil || !strings.Contains(err.Error(), `-log-format "yaml": want text or json`) {
		t.Errorf("RATION_LOG_FORMAT=yaml: %v, want it refused", err)
	}
	// The flag overrides the variable.
	if err := run(context.Background(), []string{"-dev", "-validate", "-log-format", "json"}, &bytes.Buffer{}, &bytes.Buffer{}, env); err != nil {
		t.Errorf("-log-format json over RATION_LOG_FORMAT=yaml: %v", err)
	}
}

// checkBuildInfo: /metrics at url serves ration_build_info for this build.
func checkBuildInfo(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	i := buildinfo.Get()
	want := fmt.Sprintf(`ration_build_info{commit=%q,go=%q,version=%q} 1`, i.Commit, i.Go, i.Version)
	if !strings.Contains(string(body), "\n"+want+"\n") {
		t.Errorf("%s lacks %s", url, want)
	}
}

// -log-format json: every line the node writes to stderr is one JSON
// record, Raft's included, and -dev's note is a record too.
func TestJSONLogs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr harness.LogBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-dev", "-raft", "127.0.0.1:0", "-grpc", "127.0.0.1:0", "-http", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-log-format", "json", "-log-level", "debug"},
			&bytes.Buffer{}, &stderr, noEnv)
	}()
	records := func() (recs []map[string]any) {
		for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
			if l == "" {
				continue
			}
			var rec map[string]any
			if err := json.Unmarshal([]byte(l), &rec); err != nil {
				t.Fatalf("stderr line %q is not JSON: %v", l, err)
			}
			recs = append(recs, rec)
		}
		return recs
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var dev, raft bool
		for _, r := range records() {
			if r["msg"] == "coordinator -dev: data deleted on exit" && r["grpc"] != nil && r["admin"] != nil {
				dev = true
			}
			if r["component"] == "raft" {
				raft = true
			}
		}
		if dev && raft {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("coordinator -dev exited: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no JSON record of -dev and of Raft on stderr:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("coordinator -dev returned %v on shutdown", err)
	}
	records()
}
