package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// node is one coordinator process of the restore test, with fixed
// loopback ports so that it can come back at the same Raft address.
type node struct {
	id                      string
	raft, grpc, http, admin string
	dir                     string
	viaLaunch, bootstrap    bool
}

func (n node) env(rulesFile string) []string {
	e := []string{
		"RATION_ID=" + n.id, "RATION_RAFT=" + n.raft, "RATION_GRPC=" + n.grpc, "RATION_HTTP=" + n.http,
		"RATION_ADMIN=" + n.admin, "RATION_INSECURE=true", "RATION_DATA_DIR=" + n.dir, "RATION_RULES=" + rulesFile,
		// Fast elections, and a snapshot after every entry.
		"RATION_RAFT_HEARTBEAT_TIMEOUT=300ms", "RATION_RAFT_ELECTION_TIMEOUT=300ms", "RATION_RAFT_LEADER_LEASE_TIMEOUT=150ms",
		"RATION_SNAPSHOT_INTERVAL=200ms", "RATION_SNAPSHOT_THRESHOLD=1",
	}
	if n.viaLaunch {
		return append(e, "POD_NAME="+n.id)
	}
	if n.bootstrap {
		return append(e, "RATION_BOOTSTRAP=true")
	}
	return e
}

// start runs the node the way the StatefulSet does: coordinator-0 with
// what coordinator-launch gives it when no member is ready
// (RATION_BOOTSTRAP=true; the launcher would ask DNS, which a test must
// not), the others through coordinator-launch itself, joining through
// coordinator-0's admin listener.
func (n node) start(t *testing.T, rulesFile, join string) *proc {
	t.Helper()
	env := n.env(rulesFile)
	if n.viaLaunch {
		p := start(t, "coordinator-launch", append(env, "RATION_JOIN="+join), binary(t, "coordinator"))
		p.wait(t, coordStarted, 60*time.Second)
		return p
	}
	p := start(t, "coordinator", env)
	p.wait(t, coordStarted, 60*time.Second)
	return p
}

// coordinatorCmd runs an operator command and returns its output.
func coordinatorCmd(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(binary(t, "coordinator"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("coordinator %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// pool reads a quota's pool from `coordinator quotas`.
func pool(t *testing.T, addr, quota string) (float64, bool) {
	t.Helper()
	for _, l := range strings.Split(coordinatorCmd(t, "quotas", "-addr", addr), "\n") {
		f := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(l), -1)
		if len(f) >= 4 && f[0] == quota {
			v, err := strconv.ParseFloat(f[3], 64)
			if err != nil {
				t.Fatalf("quotas: pool %q: %v", f[3], err)
			}
			return v, true
		}
	}
	return 0, false
}

func statusField(t *testing.T, addr, field string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + field + `\s+(\d+)`).FindStringSubmatch(coordinatorCmd(t, "status", "-addr", addr))
	if m == nil {
		return -1
	}
	v, _ := strconv.Atoi(m[1])
	return v
}

// TestRestoreFromSnapshot runs docs/runbook.md's "Restoring from a
// snapshot" on three real coordinators, formed as the StatefulSet forms
// them (coordinator-1 and -2 through coordinator-launch): spend part of a
// slowly refilling leased quota, back up one member's newest snapshot
// directory, stop every member, wipe every data directory, put the
// snapshot in each, and start them again at the same ids and addresses.
// The group must come back with a leader, and the quota with what had been
// spent, not a full pool.
func TestRestoreFromSnapshot(t *testing.T) {
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yaml")
	const rules = `rules:
  - name: allowance
    match: {account: "*"}
    burst: 100
    rate: 1/h
    mode: leased
    on_failure: fail_closed
    lease: {period: 2s}
`
	if err := os.WriteFile(rulesFile, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	var nodes []node
	for i := range 3 {
		nodes = append(nodes, node{
			id: fmt.Sprintf("coordinator-%d", i), raft: closedPort(t), grpc: closedPort(t), http: closedPort(t), admin: closedPort(t),
			dir: filepath.Join(dir, fmt.Sprintf("data-%d", i)), viaLaunch: i > 0, bootstrap: i == 0,
		})
	}
	join := nodes[0].admin
	var procs []*proc
	for _, n := range nodes {
		procs = append(procs, n.start(t, rulesFile, join))
	}
	eventually(t, 30*time.Second, "three voters", func() bool {
		return strings.Count(coordinatorCmd(t, "status", "-addr", join), "Voter") == 3
	})
	for _, p := range procs[1:] {
		if !strings.Contains(p.output(), "coordinator-launch: ") || !strings.Contains(p.output(), "joined the cluster") {
			t.Fatalf("%s: not joined through coordinator-launch:\n%s", p.name, p.output())
		}
	}

	// Spend 60 of the 100 tokens through an agent, which then releases
	// what it holds.
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.grpc)
	}
	agent := start(t, "gateway-agent", nil, "-dev", "-rules", rulesFile, "-coordinators", strings.Join(addrs, ","),
		"-http", "127.0.0.1:0", "-grpc", "127.0.0.1:0", "-id", "restore-agent")
	agentHTTP := agent.wait(t, agentStarted, 30*time.Second)[2]
	spent := 0
	deadline := time.Now().Add(20 * time.Second)
	for spent < 60 && time.Now().Before(deadline) {
		if _, r := httpPost(t, "http://"+agentHTTP+"/v1/allow", `{"descriptors":{"account":"a1"}}`); strings.Contains(r, `"allowed":true`) {
			spent++
		} else {
			time.Sleep(50 * time.Millisecond) // a cold start, or waiting for a larger slice
		}
	}
	if spent < 60 {
		t.Fatalf("admitted %d of 60 requests within 20s", spent)
	}
	agent.stop(t)
	const quota = "allowance|account=a1"
	var before float64
	eventually(t, 10*time.Second, "the released tokens back in the pool", func() bool {
		p, ok := pool(t, join, quota)
		before = p
		return ok && p > 0 && p <= 100-60+1
	})

	// Back up the newest complete snapshot of a follower taken after the
	// release.
	// coordinator-0 showed the release applied: its applied index covers it.
	m := regexp.MustCompile(`(?m)^commit / applied\s+\d+ / (\d+)`).FindStringSubmatch(coordinatorCmd(t, "status", "-addr", join))
	if m == nil {
		t.Fatal("status: no applied index")
	}
	applied, _ := strconv.Atoi(m[1])
	var backup string
	eventually(t, 20*time.Second, "a snapshot taken after the release", func() bool {
		if statusField(t, nodes[1].admin, "last snapshot") < applied {
			return false
		}
		newest := newestSnapshot(t, filepath.Join(nodes[1].dir, "snapshots"))
		if newest == "" {
			return false
		}
		backup = filepath.Join(dir, "backup", newest)
		return copyDir(t, filepath.Join(nodes[1].dir, "snapshots", newest), backup) == nil
	})

	// Stop the group, wipe every member, restore the snapshot into each.
	for _, p := range procs {
		p.stop(t)
	}
	for _, n := range nodes {
		if err := os.RemoveAll(n.dir); err != nil {
			t.Fatal(err)
		}
		if err := copyDir(t, backup, filepath.Join(n.dir, "snapshots", filepath.Base(backup))); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(n.dir, "raft.db")); !os.IsNotExist(err) {
			t.Fatalf("%s: raft.db left after the wipe", n.id)
		}
	}
	procs = procs[:0]
	for _, n := range nodes {
		procs = append(procs, n.start(t, rulesFile, join))
	}
	if !strings.Contains(procs[0].output(), "-bootstrap ignored") {
		t.Errorf("coordinator-0 did not ignore -bootstrap on the restored state:\n%s", procs[0].output())
	}
	eventually(t, 30*time.Second, "a leader ready after the restore", func() bool {
		code, _ := httpGet(t, "http://"+nodes[0].http+"/readyz")
		return code == 200 && strings.Count(coordinatorCmd(t, "status", "-addr", join), "Voter") == 3
	})
	after, ok := pool(t, join, quota)
	if !ok {
		t.Fatalf("quota %s missing after the restore", quota)
	}
	t.Logf("spent %d; pool %.2f before the backup, %.2f after the restore", spent, before, after)
	if after > before+1 || after < before-1 {
		t.Errorf("pool after the restore %.2f, before %.2f: the snapshot's state was not restored", after, before)
	}
	for _, n := range nodes {
		_, body := httpGet(t, "http://"+n.http+"/metrics")
		if m := regexp.MustCompile(`(?m)^ration_coordinator_snapshot_restores_total (\d+)`).FindStringSubmatch(body); m == nil || m[1] == "0" {
			t.Errorf("%s: ration_coordinator_snapshot_restores_total %v, want at least 1", n.id, m)
		}
	}
}

func copyDir(t testing.TB, src, dst string) error {
	t.Helper()
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(out, 0o750)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(out, b, 0o640)
	})
}

// newestSnapshot returns the name of the newest finished snapshot
// directory: names are TERM-INDEX-MILLIS (hashicorp/raft's file snapshot
// store), compared as numbers; ".tmp" ones are still being written.
func newestSnapshot(t testing.TB, dir string) string {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	best, bestKey := "", []int64(nil)
	for _, e := range entries {
		if !e.IsDir() || strings.HasSuffix(e.Name(), ".tmp") {
			continue
		}
		var key []int64
		for _, f := range strings.Split(e.Name(), "-") {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				t.Fatalf("snapshot directory %q: not TERM-INDEX-MILLIS", e.Name())
			}
			key = append(key, n)
		}
		if bestKey == nil || slices.Compare(key, bestKey) > 0 {
			best, bestKey = e.Name(), key
		}
	}
	return best
}
