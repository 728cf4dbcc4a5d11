package chaos

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// CoordinatorProcs is a coordinator group of real processes (cmd/coordinator
// built from the tree), so a scenario can SIGKILL or SIGSTOP a node. Node 0
// bootstraps, the others join through its admin listener (every node has
// one on a port of its own); a restarted node reopens its
// data dir with the same flags (bootstrap and join are no-ops on a node
// with state). Raft timing is the in-process harness's: elections well
// under a second, a Tick every 100ms, a 200ms safety margin.
type CoordinatorProcs struct {
	Procs []*Proc
	GRPC  []string
	HTTP  []string // each node's HTTP listener (/metrics)
	Admin []string // each node's admin listener (-admin)
	admin []rationv1.AdminClient
}

// StartCoordinatorProcs starts n nodes and waits until all are voters and
// one leads.
func StartCoordinatorProcs(t testing.TB, n int, rulesYAML string) *CoordinatorProcs {
	t.Helper()
	return StartCoordinatorGroup(t, GroupOptions{N: n, Rules: rulesYAML})
}

// GroupOptions configure StartCoordinatorGroup.
type GroupOptions struct {
	N     int
	Rules string // rules YAML
	// ID prefixes the node ids (default "node": node0, node1, ...) and
	// names their logs.
	ID string
	// Args are added to every node's flags (-region, -upstream, ...).
	Args []string
}

// StartCoordinatorGroup starts o.N nodes and waits until all are voters
// and one leads.
func StartCoordinatorGroup(t testing.TB, o GroupOptions) *CoordinatorProcs {
	t.Helper()
	n, rulesYAML := o.N, o.Rules
	id, name := o.ID, o.ID
	if id == "" {
		id, name = "node", "coordinator"
	}
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(rulesYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	// A node of a regional group also holds leases from the global group
	// as its region: its certificate names both (docs/security.md).
	region := ""
	for i, a := range o.Args {
		if a == "-region" && i+1 < len(o.Args) {
			region = o.Args[i+1]
		}
	}
	pki := pkiOf(t)
	c := &CoordinatorProcs{}
	for range n {
		c.GRPC = append(c.GRPC, "127.0.0.1:"+strconv.Itoa(harness.FreePort(t)))
		c.HTTP = append(c.HTTP, "127.0.0.1:"+strconv.Itoa(harness.FreePort(t)))
		c.Admin = append(c.Admin, "127.0.0.1:"+strconv.Itoa(harness.FreePort(t)))
	}
	for i := range n {
		group := region
		if group == "" {
			group = tlsfiles.GlobalGroup
		}
		uris := []string{tlsfiles.CoordinatorURI(group, fmt.Sprintf("%s%d", id, i))}
		if region != "" {
			uris = append(uris, tlsfiles.URI(tlsfiles.RoleRegion, region))
		}
		args := []string{
			"-id", fmt.Sprintf("%s%d", id, i),
			"-raft", "127.0.0.1:" + strconv.Itoa(harness.FreePort(t)),
			"-grpc", c.GRPC[i],
			"-http", c.HTTP[i],
			"-admin", c.Admin[i],
			"-data-dir", filepath.Join(dir, fmt.Sprintf("%s%d", id, i)),
			"-rules", rulesPath,
			"-raft-heartbeat-timeout", "300ms", "-raft-election-timeout", "300ms", "-raft-leader-lease-timeout", "150ms",
			"-tick", "100ms", "-safety-margin", "200ms", "-log-level", "warn",
		}
		if i == 0 {
			others := make([]string, 0, n-1)
			for j := 1; j < n; j++ {
				others = append(others, fmt.Sprintf("%s%d", id, j))
			}
			args = append(args, "-bootstrap", "-initial-members", strings.Join(others, ","))
		} else {
			args = append(args, "-join", c.Admin[0])
		}
		args = append(append(args, tlsFlags(pki.Issue(fmt.Sprintf("%s%d", id, i), uris...))...), o.Args...)
		c.Procs = append(c.Procs, StartProc(t, fmt.Sprintf("%s%d", name, i), "coordinator", args...))
		conn, err := grpc.NewClient(c.Admin[i], asOperator(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		c.admin = append(c.admin, rationv1.NewAdminClient(conn))
		if i == 0 {
			c.Leader(t)
		}
	}
	c.WaitVoters(t, n)
	return c
}

// WaitVoters waits until the leader lists n servers.
func (c *CoordinatorProcs) WaitVoters(t testing.TB, n int) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("%d voters", n), func() bool {
		st := c.status(c.Leader(t))
		return st != nil && len(st.Servers) == n
	})
}

// WaitCaughtUp waits until node i (restarted) follows a leader and has
// applied everything the leader had committed when the wait began: a
// voter again in fact, not only in the configuration, so that a fault
// after it meets a healthy majority rather than two failures at once.
func (c *CoordinatorProcs) WaitCaughtUp(t testing.TB, i int) {
	t.Helper()
	var commit uint64
	waitFor(t, 30*time.Second, fmt.Sprintf("node %d caught up with the leader", i), func() bool {
		if commit == 0 {
			l := c.Leader(t)
			if l == i {
				return true
			}
			st := c.status(l)
			if st == nil || st.State != "Leader" {
				return false
			}
			commit = st.CommitIndex
		}
		st := c.status(i)
		return st != nil && st.State == "Follower" && st.AppliedIndex >= commit
	})
}

func (c *CoordinatorProcs) status(i int) *rationv1.StatusResponse {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	st, err := c.admin[i].Status(ctx, &rationv1.StatusRequest{})
	if err != nil {
		return nil
	}
	return st
}

// KillLeader SIGKILLs the leader's process, waits for a new leader, and
// after down starts the killed node again (same data dir and flags). It
// returns the killed node's index, and when the process was killed and
// when the next leader was seen (mono clock).
func (c *CoordinatorProcs) KillLeader(t testing.TB, down time.Duration) (i int, kill, elected time.Duration) {
	t.Helper()
	i = c.Leader(t)
	kill = mono()
	c.Procs[i].Kill()
	c.Leader(t)
	elected = mono()
	time.Sleep(down)
	c.Procs[i].Start()
	return i, kill, elected
}

// Leader waits until a running node says it leads, and returns it.
func (c *CoordinatorProcs) Leader(t testing.TB) int {
	t.Helper()
	leader := -1
	waitFor(t, 30*time.Second, "a coordinator leader", func() bool {
		for i, p := range c.Procs {
			if p.Exited() {
				continue
			}
			if st := c.status(i); st != nil && st.State == "Leader" {
				leader = i
				return true
			}
		}
		return false
	})
	return leader
}

// Metric scrapes node i's /metrics and returns the sum of every sample of
// the named metric (all label sets), and whether any was found.
func (c *CoordinatorProcs) Metric(i int, name string) (float64, bool, error) {
	return scrapeMetric(c.HTTP[i], name)
}

// scrapeMetric reads http://addr/metrics and returns the sum of every
// sample of the named metric (all label sets), and whether any was found.
func scrapeMetric(addr, name string) (float64, bool, error) {
	hc := &http.Client{Timeout: time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false, fmt.Errorf("GET %s/metrics: %s", addr, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return 0, false, err
	}
	var sum float64
	found := false
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, false, fmt.Errorf("%s: %q: %v", addr, line, err)
		}
		sum, found = sum+v, true
	}
	return sum, found, nil
}
