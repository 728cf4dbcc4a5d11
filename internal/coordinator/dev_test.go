package coordinator_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/rules"
)

// TestStartDev: the embedded single node serves leases at once, and Close
// deletes its data dir. It also installs the process-wide Raft metrics
// bridge (the only test that does) and checks Raft's metrics arrive. Its
// JSON log names each key once per record, and a healthy start warns of
// nothing but the plaintext.
func TestStartDev(t *testing.T) {
	raftReg := prometheus.NewRegistry()
	if err := coordinator.BridgeRaftMetrics(raftReg); err != nil {
		t.Fatal(err)
	}
	set, err := rules.Parse("rules.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	ctx := timeout(t, 30*time.Second)
	var logs harness.LogBuffer
	n, addr, err := coordinator.StartDev(ctx, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})), set)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	cl := coordinator.NewClient([]string{addr}, coordinator.ClientOptions{})
	defer cl.Close()
	h := newHolder("agent")
	req := h.request(testQuotas, 1)
	resp, err := cl.Renew(ctx, req)
	if err != nil {
		t.Fatalf("renew against StartDev: %v", err)
	}
	if err := h.adopt(req, resp); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.GatherAndLint(n.Registry()); err != nil || len(problems) > 0 {
		t.Errorf("metric lint: %v %v", err, problems)
	}
	if got, err := testutil.GatherAndCount(raftReg, "ration_raft_apply"); err != nil || got == 0 {
		t.Errorf("bridged Raft metric ration_raft_apply: count %d, %v", got, err)
	}
	data := n.DataDir()
	if _, err := os.Stat(data); err != nil {
		t.Fatalf("dev data dir: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Errorf("dev data dir %s still there after Close: %v", data, err)
	}
	if _, _, err := coordinator.StartDev(ctx, nil, nil); err == nil {
		t.Error("StartDev without rules succeeded")
	}
	checkJSONLog(t, logs.String(), "PLAINTEXT by -insecure or -dev")
}

// checkJSONLog: every line of log is a JSON object naming each key once,
// and the only warnings are those whose message starts with one of
// allowed (raft's start-up is not a warning).
func checkJSONLog(t *testing.T, log string, allowed ...string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(log), "\n")
	if len(lines) < 3 {
		t.Fatalf("only %d log lines:\n%s", len(lines), log)
	}
	for _, l := range lines {
		dec := json.NewDecoder(strings.NewReader(l))
		seen := map[string]bool{}
		level, msg := "", ""
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			t.Fatalf("log line %q: not a JSON object (%v)", l, err)
		}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				t.Fatalf("log line %q: %v", l, err)
			}
			key, _ := tok.(string)
			if seen[key] {
				t.Errorf("log line names %q twice: %s", key, l)
			}
			seen[key] = true
			var v any
			if err := dec.Decode(&v); err != nil {
				t.Fatalf("log line %q: %v", l, err)
			}
			switch key {
			case "level":
				level, _ = v.(string)
			case "msg":
				msg, _ = v.(string)
			}
		}
		if level != "WARN" && level != "ERROR" {
			continue
		}
		ok := false
		for _, a := range allowed {
			ok = ok || strings.HasPrefix(msg, a)
		}
		if !ok {
			t.Errorf("a healthy start logged at %s: %s", level, l)
		}
	}
}

// TestHTTPEndpoints: /readyz is ready on the leader (LeaderElected
// applied) and on a follower that knows the leader; /healthz is ok;
// /metrics lints clean and shows who leads.
func TestHTTPEndpoints(t *testing.T) {
	c := harness.StartCoordinators(t, 3, testRules, func(cfg *coordinator.Config) { cfg.HTTPAddr = "127.0.0.1:0" })
	leader, _ := c.Leader(t)
	get := func(n *coordinator.Node, path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + n.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, i := range c.Live() {
		n := c.Node(i)
		for {
			code, body := get(n, "/readyz")
			if code == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node%d /readyz = %d %q", i, code, body)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if code, body := get(n, "/healthz"); code != http.StatusOK {
			t.Errorf("node%d /healthz = %d %q", i, code, body)
		}
		code, body := get(n, "/metrics")
		want := "ration_coordinator_leader 0"
		if i == leader {
			want = "ration_coordinator_leader 1"
		}
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("node%d /metrics = %d, want it to contain %q", i, code, want)
		}
		if problems, err := testutil.GatherAndLint(c.Registry(i)); err != nil || len(problems) > 0 {
			t.Errorf("node%d metric lint: %v %v", i, err, problems)
		}
	}
}
