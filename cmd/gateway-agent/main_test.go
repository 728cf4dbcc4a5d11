package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/buildinfo"
	"github.com/ration-dev/ration/internal/harness"
)

func noEnv(string) (string, bool) { return "", false }

func TestValidateNamesLineAndField(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("rules:\n  - name: a\n    match: {k: v}\n    burst: 10\n    rate: -1\n    on_failure: sometimes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-validate", "-rules", bad}, &stdout, &stderr, noEnv)
	if !errors.Is(err, errInvalidRules) || exitCode(err) != 1 {
		t.Fatalf("run(-validate bad) = %v (exit %d), want errInvalidRules (exit 1)", err, exitCode(err))
	}
	out := stderr.String()
	for _, want := range []string{"bad.yaml:5:", "rate", "bad.yaml:6:", "on_failure"} {
		if !strings.Contains(out, want) {
			t.Errorf("-validate output lacks %q; got:\n%s", want, out)
		}
	}

	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("rules:\n  - name: a\n    match: {k: v}\n    burst: 10\n    rate: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	if err := run(context.Background(), []string{"-validate", "-rules", good}, &stdout, &stderr, noEnv); err != nil {
		t.Fatalf("run(-validate good) = %v", err)
	}
	if !strings.Contains(stdout.String(), "1 rules, valid") {
		t.Fatalf("stdout = %q, want a summary", stdout.String())
	}
}

func TestConfigErrorsAreAllReported(t *testing.T) {
	env := map[string]string{"RATION_DECISION_TIMEOUT": "soon"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), nil, &stdout, &stderr, lookup)
	if err == nil || !strings.Contains(err.Error(), "RATION_DECISION_TIMEOUT") {
		t.Fatalf("run with a bad env duration = %v, want it named", err)
	}
	err = run(context.Background(), []string{"-decision-timeout", "0s", "-http", "nope", "-grpc-workers", "-1",
		"-rlqs-delta", "-1s", "-rlqs-max-ttl", "1500ms", "-rlqs-take-ttl", "9s", "-rlqs-grace", "2h", "-rlqs-max-streams", "-3", "-rlqs-max-buckets", "-1"}, &stdout, &stderr, noEnv)
	for _, want := range []string{"-rules", "-decision-timeout", "-http", "-grpc-workers -1: must be in [0, 4096]",
		"-rlqs-delta -1s", "-rlqs-max-ttl 1.5s: must be whole seconds", "-rlqs-take-ttl 9s", "-rlqs-grace 2h0m0s", "-rlqs-max-streams -3", "-rlqs-max-buckets -1"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("run with several bad settings = %v, want %s named", err, want)
		}
	}
	if err := run(context.Background(), []string{"extra"}, &stdout, &stderr, noEnv); err == nil {
		t.Error("a stray argument must be an error")
	}
}

// An agent that leases from coordinators talks to them over mutual TLS,
// or in plaintext only by choice: without TLS files and without -insecure
// (or -dev) it does not start, and says what to set. Without -coordinators
// there is no lease link to protect, and nothing is asked.
func TestPlaintextToCoordinatorsOnlyByChoice(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte("rules:\n  - name: a\n    match: {k: v}\n    burst: 10\n    rate: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"-rules", rules, "-redis", "127.0.0.1:1", "-http", "127.0.0.1:0", "-grpc", "127.0.0.1:0"}
	err := run(context.Background(), append(base, "-coordinators", "127.0.0.1:1"), &bytes.Buffer{}, &bytes.Buffer{}, noEnv)
	for _, want := range []string{`-coordinators "127.0.0.1:1" without TLS`, "-tls-cert", "-insecure"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("run(-coordinators, no TLS, no -insecure) = %v, want an error containing %q", err, want)
		}
	}
	if exitCode(err) != 2 {
		t.Errorf("exit code %d, want 2 (a configuration error)", exitCode(err))
	}
	env := func(k string) (string, bool) { return "127.0.0.1:1", k == "RATION_COORDINATORS" }
	if err := run(context.Background(), base, &bytes.Buffer{}, &bytes.Buffer{}, env); err == nil || !strings.Contains(err.Error(), "without TLS") {
		t.Errorf("RATION_COORDINATORS without TLS = %v, want it refused", err)
	}
	for _, c := range []struct {
		coordinators string
		insecure     bool
	}{{"127.0.0.1:1", true}, {"", false}} {
		cfg := agent.DefaultConfig()
		cfg.RulesFile, cfg.Redis, cfg.Coordinators, cfg.Insecure = rules, "127.0.0.1:1", c.coordinators, c.insecure
		if err := cfg.Check(); err != nil {
			t.Errorf("Check(coordinators %q, insecure %v) = %v, want it accepted", c.coordinators, c.insecure, err)
		}
	}
}

// -log-format takes text or json (RATION_LOG_FORMAT too); another value is
// refused naming the flag and what it accepts, with the other problems.
func TestLogFormatRefused(t *testing.T) {
	err := run(context.Background(), []string{"-dev", "-log-format", "xml", "-http", "nope"}, &bytes.Buffer{}, &bytes.Buffer{}, noEnv)
	for _, want := range []string{`-log-format "xml": want text or json`, "-http"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("run(-log-format xml) = %v, want %q", err, want)
		}
	}
	env := func(k string) (string, bool) { return "logfmt", k == "RATION_LOG_FORMAT" }
	err = run(context.Background(), []string{"-dev"}, &bytes.Buffer{}, &bytes.Buffer{}, env)
	if err == nil || !strings.Contains(err.Error(), `-log-format "logfmt": want text or json`) {
		t.Errorf("run with RATION_LOG_FORMAT=logfmt = %v, want it refused", err)
	}
	if exitCode(err) != 2 {
		t.Errorf("exit code %d, want 2", exitCode(err))
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
		{[]string{"-http", "127.0.0.1:0", "-dev", "-grpc", "127.0.0.1:0"}, "", true},
		{[]string{"-rules", "-dev"}, "", false},         // a rules file named -dev
		{[]string{"-log-level=warn", "-dev"}, "", true}, // -name=value takes no next argument
		{[]string{"--", "-dev"}, "", false},             // past the end of the flags
		{[]string{"extra", "-dev"}, "", false},          // past the first argument
		{[]string{"-dev=yes"}, "", false},               // not a boolean: the real parse refuses it
		{[]string{"-bogus", "-dev"}, "", false},         // stops at the unknown flag, which the real parse reports
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

// examples/rules.yaml is valid for the agent, and is what -dev runs with
// (coordinator -dev too: its test holds it to the same file), so an agent
// under -dev pointed at coordinator -dev knows the same leased rules.
func TestExampleRules(t *testing.T) {
	const file = "../../examples/rules.yaml"
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"-validate", "-rules", file}, &stdout, &bytes.Buffer{}, noEnv); err != nil {
		t.Fatalf("-validate %s: %v", file, err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(agent.DevRules(), b) {
		t.Fatalf("-dev does not run with %s", file)
	}
}

// -version prints the build and exits 0, even with a malformed variable
// in the environment.
func TestVersion(t *testing.T) {
	bad := func(k string) (string, bool) { return "soon", k == "RATION_DECISION_TIMEOUT" }
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"-version"}, &stdout, &stderr, bad); err != nil {
		t.Fatalf("run(-version) = %v (exit %d)", err, exitCode(err))
	}
	if want := "gateway-agent " + buildinfo.Get().String() + "\n"; stdout.String() != want {
		t.Fatalf("-version printed %q, want %q", stdout.String(), want)
	}
}

// -dev starts a complete system with no other process and prints how to use
// it; a curl-equivalent request against the printed address is admitted,
// and so is one of the leased sample rule (the embedded coordinator).
func TestDevModeServes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr harness.LogBuffer
	done := make(chan error, 1)
	jsonLogs := func(k string) (string, bool) { return "json", k == "RATION_LOG_FORMAT" }
	go func() {
		done <- run(ctx, []string{"-dev=1", "-http", "127.0.0.1:0", "-grpc", "127.0.0.1:0"}, &stdout, &stderr, jsonLogs)
	}()
	var url string
	for i := 0; i < 500 && url == ""; i++ {
		for _, line := range strings.Split(stdout.String(), "\n") {
			if i := strings.Index(line, "curl -si '"); i >= 0 && url == "" {
				url = strings.TrimSuffix(line[i+len("curl -si '"):], "'")
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if url == "" {
		t.Fatalf("-dev printed no check command; stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
	codes := make([]int, 0, 11)
	for i := 0; i < 11; i++ {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	if codes[0] != 200 || codes[10] != 429 {
		t.Fatalf("check codes = %v, want 200 first and 429 on the 11th (burst 10)", codes)
	}
	base := strings.Split(url, "/v1/")[0]
	// The leased sample rule (fail_closed) is admitted from a lease of the
	// embedded coordinator, which main wires in (dev.go): without it every
	// answer would be 503.
	leased := 0
	for deadline := time.Now().Add(10 * time.Second); leased != 200 && time.Now().Before(deadline); {
		resp, err := http.Get(base + "/v1/check?endpoint=checkout")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if leased = resp.StatusCode; leased != 200 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if leased != 200 {
		t.Fatalf("leased rule hot-endpoint answered %d for 10s, want 200 from the embedded coordinator's lease", leased)
	}
	checkBuildInfo(t, base+"/metrics")
	checkGuideSubject(t, stdout.String(), base)
	if !strings.Contains(stdout.String(), "leased from the coordinator embedded in this process") {
		t.Errorf("-dev without -coordinators: the guide does not name the embedded coordinator:\n%s", stdout.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run returned %v after cancel, want a clean shutdown", err)
	}
	// RATION_LOG_FORMAT=json: every line on stderr is one JSON record.
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	started := false
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("stderr line %q is not JSON: %v", l, err)
		}
		if rec["msg"] == "gateway-agent started" && rec["dev"] == true && rec["level"] == "INFO" {
			started = true
		}
	}
	if !started {
		t.Errorf("no JSON record of the start on stderr:\n%s", stderr.String())
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

// checkGuideSubject runs the guide's rule+subject example as printed, then
// the same subject by descriptors: the second spends from what the first
// left (the two name one quota, as the guide says), where a subject of
// another spelling would start full.
func checkGuideSubject(t *testing.T, guide, base string) {
	t.Helper()
	const marker = `/v1/allow -d '{"rule":`
	i := strings.Index(guide, marker)
	if i < 0 {
		t.Fatalf("the guide has no rule+subject example:\n%s", guide)
	}
	body := guide[i+len("/v1/allow -d '"):]
	body = body[:strings.Index(body, "'")]
	allow := func(body string) (remaining float64) {
		resp, err := http.Post(base+"/v1/allow", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var d struct {
			Allowed   bool    `json:"allowed"`
			Remaining float64 `json:"remaining"`
			Rule      string  `json:"rule"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || !d.Allowed || d.Rule != "per-user" {
			t.Fatalf("POST %s: %+v, %v; want admitted by per-user", body, d, err)
		}
		return d.Remaining
	}
	first := allow(body)
	// per-user: burst 100, 10/s. A second quota would answer 80 at least;
	// the same one at most first - 20 plus what refilled in between.
	if second := allow(`{"descriptors":{"user":"alice"},"cost":20}`); second >= 80 || second > first-10 {
		t.Errorf("the guide's %s left %v; descriptors user=alice (cost 20) then left %v: not the same quota", body, first, second)
	}
}

// With -coordinators the guide says the leases come from them, not from
// an embedded node (there is none).
func TestDevGuideNamesTheCoordinators(t *testing.T) {
	g := devGuide("127.0.0.1:8080", "127.0.0.1:8081", []string{"127.0.0.1:8301"})
	if !strings.Contains(g, "leased from the coordinators at 127.0.0.1:8301") || strings.Contains(g, "embedded") {
		t.Errorf("guide with -coordinators 127.0.0.1:8301:\n%s", g)
	}
}
