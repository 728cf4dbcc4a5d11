package harness

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/rules"
	"github.com/ration-dev/ration/internal/tokenfile"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// How long the Raft helpers wait for a cluster to get somewhere: generous,
// since -race on two shared cores slows elections and catch-up tenfold.
const (
	raftWait       = 30 * time.Second
	raftPoll       = 10 * time.Millisecond
	raftStartTries = 5
)

// Coordinators is a coordinator cluster run in-process by
// StartCoordinators: real Raft over TCP on loopback, BoltDB in
// t.TempDir(), real gRPC listeners (each node's lease and admin listeners
// on ports of their own). Node i keeps its addresses across Kill/Restart
// and Remove/Add. Methods that wait fail the test on timeout and must be
// called from the test's goroutine.
type Coordinators struct {
	t     testing.TB
	rules *rules.Set
	opts  []func(*coordinator.Config)
	logs  *testLog

	// pki, when set (StartCoordinatorsTLS), runs every node with mutual
	// TLS; the harness's own admin calls use an operator certificate.
	pki       *PKI
	adminDial []grpc.DialOption

	mu      sync.Mutex
	slots   []*coordSlot
	clients []*coordinator.Client
}

type coordSlot struct {
	cfg  coordinator.Config // addresses fixed after the first start
	node *coordinator.Node  // nil while down
	reg  *prometheus.Registry
}

// RaftTestConfig is the configuration StartCoordinators gives every node
// before its options: short Raft timeouts (elections in well under a
// second), a Tick every 100ms, no automatic snapshots (tests take them
// with Raft().Snapshot()), and a 200ms safety margin.
func RaftTestConfig() coordinator.Config {
	c := coordinator.DefaultConfig()
	c.RaftAddr = "127.0.0.1:0"
	c.GRPCAddr = "127.0.0.1:0"
	// A port of its own: several nodes share the host, and none may take
	// the default admin port.
	c.AdminAddr = "127.0.0.1:0"
	c.HTTPAddr = ""
	c.HeartbeatTimeout = 300 * time.Millisecond
	c.ElectionTimeout = 300 * time.Millisecond
	c.LeaderLeaseTimeout = 150 * time.Millisecond
	c.CommitTimeout = 10 * time.Millisecond
	c.SnapshotThreshold = 1 << 40
	c.SnapshotInterval = time.Hour
	c.TickInterval = 100 * time.Millisecond
	c.ApplyTimeout = 3 * time.Second
	c.SafetyMargin = 200 * time.Millisecond
	c.ShutdownTimeout = 2 * time.Second
	// Plaintext by choice; StartCoordinatorsTLS turns TLS on.
	c.Insecure = true
	return c
}

// StartCoordinators starts n coordinator nodes with the rules in
// rulesYAML: node 0 bootstraps, the others join through its admin address,
// so every start exercises -join. opts adjust every node's configuration
// (applied after RaftTestConfig). It returns once all n are voters and a
// leader serves. Everything stops in t.Cleanup.
//
// Node logs go to t.Log at the level in RATION_TEST_LOG (debug, info,
// warn, error; default warn).
func StartCoordinators(t testing.TB, n int, rulesYAML string, opts ...func(*coordinator.Config)) *Coordinators {
	t.Helper()
	return startCoordinators(t, n, rulesYAML, nil, opts...)
}

// StartCoordinatorsTLS is StartCoordinators with mutual TLS on every link:
// each node gets a certificate of pki (PKI.Coordinator, applied after
// opts), and the harness's own admin calls (Remove) present an operator
// certificate. Clients of the cluster need certificates of pki too
// (PKI.DialOptions).
func StartCoordinatorsTLS(t testing.TB, n int, rulesYAML string, pki *PKI, opts ...func(*coordinator.Config)) *Coordinators {
	t.Helper()
	return startCoordinators(t, n, rulesYAML, pki, append(opts, pki.Coordinator)...)
}

func startCoordinators(t testing.TB, n int, rulesYAML string, pki *PKI, opts ...func(*coordinator.Config)) *Coordinators {
	t.Helper()
	RequiresProcesses(t)
	if n < 1 {
		t.Fatalf("harness: StartCoordinators(%d): need at least one node", n)
	}
	set, err := rules.Parse("rules.yaml", []byte(rulesYAML))
	if err != nil {
		t.Fatalf("harness: rules: %v", err)
	}
	c := &Coordinators{t: t, rules: set, opts: opts, logs: newTestLog(t), pki: pki}
	if pki != nil {
		c.adminDial = pki.DialOptions(pki.Operator("harness"))
	}
	t.Cleanup(c.stopAll)
	for i := range n {
		cfg := RaftTestConfig()
		cfg.ID = fmt.Sprintf("node%d", i)
		cfg.Bootstrap = i == 0
		if i == 0 {
			ids := make([]string, n)
			for j := range ids {
				ids[j] = fmt.Sprintf("node%d", j)
			}
			cfg.InitialMembers = strings.Join(ids, ",")
		}
		cfg.Rules = set
		for _, o := range opts {
			o(&cfg)
		}
		if i > 0 {
			cfg.Join = c.Node(0).AdminAddr()
		}
		c.slots = append(c.slots, &coordSlot{cfg: cfg})
		c.start(i, true)
		if i == 0 {
			c.Leader(t)
		}
	}
	c.WaitVoters(t, n)
	return c
}

// start starts node i with a new data dir when fresh, else its old one.
func (c *Coordinators) start(i int, fresh bool) {
	c.t.Helper()
	c.mu.Lock()
	s := c.slots[i]
	if fresh {
		s.cfg.DataDir = c.t.TempDir()
	}
	cfg := s.cfg
	c.mu.Unlock()
	var err error
	for try := 1; try <= raftStartTries; try++ {
		reg := prometheus.NewRegistry()
		ctx, cancel := context.WithTimeout(context.Background(), raftWait)
		var node *coordinator.Node
		node, err = coordinator.Start(ctx, cfg, c.logs.logger(), reg)
		cancel()
		if err == nil {
			c.mu.Lock()
			s.node, s.reg = node, reg
			// Keep the addresses the kernel chose, so a restart (and the
			// rest of the cluster) finds the node where it was.
			s.cfg.RaftAddr = node.RaftAddr()
			s.cfg.GRPCAddr = node.GRPCAddr()
			s.cfg.AdminAddr = node.AdminAddr()
			c.mu.Unlock()
			return
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("harness: start %s: %v", s.cfg.ID, err)
}

// N is the number of node slots.
func (c *Coordinators) N() int { return len(c.slots) }

// Node returns node i, or nil while it is down.
func (c *Coordinators) Node(i int) *coordinator.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.slots[i].node
}

// Registry returns node i's metrics registry (a new one per start).
func (c *Coordinators) Registry(i int) *prometheus.Registry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.slots[i].reg
}

// DataDir returns node i's current data dir (raft.db and snapshots).
func (c *Coordinators) DataDir(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.slots[i].cfg.DataDir
}

// Live returns the indexes of the nodes that are up.
func (c *Coordinators) Live() []int {
	var out []int
	for i := range c.slots {
		if c.Node(i) != nil {
			out = append(out, i)
		}
	}
	return out
}

// GRPCAddrs returns every node's lease (gRPC) address, up or down, in
// node order: what an agent would be configured with.
func (c *Coordinators) GRPCAddrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.slots))
	for i, s := range c.slots {
		out[i] = s.cfg.GRPCAddr
	}
	return out
}

// AdminAddrs returns every node's admin address, up or down, in node
// order: what an operator would be given.
func (c *Coordinators) AdminAddrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.slots))
	for i, s := range c.slots {
		out[i] = s.cfg.AdminAddr
	}
	return out
}

// AdminDialOptions are how the harness calls the admin API: with an
// operator's certificate under TLS (StartCoordinatorsTLS), and with the
// admin token when the nodes have one (-admin-token-file, read now).
func (c *Coordinators) AdminDialOptions() []grpc.DialOption {
	c.t.Helper()
	opts := append([]grpc.DialOption(nil), c.adminDial...)
	if len(opts) == 0 {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	c.mu.Lock()
	file := c.slots[0].cfg.AdminTokenFile
	c.mu.Unlock()
	if file != "" {
		tok, err := tokenfile.Read(file)
		if err != nil {
			c.t.Fatalf("harness: admin token: %v", err)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(tokenfile.Bearer(tok)))
	}
	return opts
}

// Admin returns a client of node i's admin listener (its -admin address)
// dialed with AdminDialOptions, closed at cleanup.
func (c *Coordinators) Admin(t testing.TB, i int) rationv1.AdminClient {
	t.Helper()
	return AdminClient(t, c.Config(i).AdminAddr, c.AdminDialOptions()...)
}

// LeaderAdmin waits for a ready leader and returns a client of its admin
// listener (Admin).
func (c *Coordinators) LeaderAdmin(t testing.TB) rationv1.AdminClient {
	t.Helper()
	i, _ := c.Leader(t)
	return c.Admin(t, i)
}

// AdminClient dials the admin API at addr with opts (plaintext when
// none), closed at cleanup.
func AdminClient(t testing.TB, addr string, opts ...grpc.DialOption) rationv1.AdminClient {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatalf("harness: admin client of %s: %v", addr, err)
	}
	t.Cleanup(func() { cc.Close() })
	return rationv1.NewAdminClient(cc)
}

// AdminToken writes a random admin token to a file of its own and returns
// the file (for -admin-token-file and the CLI's -token-file) and the token.
func AdminToken(t testing.TB) (file, token string) {
	t.Helper()
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("harness: %v", err)
	}
	token = hex.EncodeToString(b)
	file = filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatalf("harness: %v", err)
	}
	return file, token
}

// Leader waits until a live node leads and serves (LeaderElected
// applied), and returns it.
func (c *Coordinators) Leader(t testing.TB) (int, *coordinator.Node) {
	t.Helper()
	var i int
	var n *coordinator.Node
	c.waitUntil(t, "a ready leader", func() (bool, string) {
		for _, j := range c.Live() {
			if nd := c.Node(j); nd != nil && nd.Ready() {
				i, n = j, nd
				return true, ""
			}
		}
		return false, "no live node is a ready leader"
	})
	return i, n
}

// WaitVoters waits until every live node's configuration has want
// servers, all of them voters.
func (c *Coordinators) WaitVoters(t testing.TB, want int) {
	t.Helper()
	c.waitUntil(t, fmt.Sprintf("%d voters", want), func() (bool, string) {
		// Every live node sees them: a member is added as a non-voter and
		// promoted later, and a follower learns the promotion after the
		// leader.
		ready := false
		for _, j := range c.Live() {
			nd := c.Node(j)
			ready = ready || nd.Ready()
			f := nd.Raft().GetConfiguration()
			if err := f.Error(); err != nil {
				return false, err.Error()
			}
			voters := 0
			for _, s := range f.Configuration().Servers {
				if s.Suffrage == raft.Voter {
					voters++
				}
			}
			if got := len(f.Configuration().Servers); got != want || voters != want {
				return false, fmt.Sprintf("node%d sees %d servers, %d of them voters", j, got, voters)
			}
		}
		if !ready {
			return false, "no ready leader"
		}
		return true, ""
	})
}

// Kill stops node i abruptly: no leadership transfer, listeners and
// connections cut, Raft shut down. Its data dir stays for Restart.
func (c *Coordinators) Kill(i int) {
	c.t.Helper()
	c.mu.Lock()
	n := c.slots[i].node
	c.slots[i].node = nil
	c.mu.Unlock()
	if n == nil {
		c.t.Fatalf("harness: kill node%d: not running", i)
	}
	if err := n.Close(); err != nil {
		c.t.Logf("harness: kill node%d: %v", i, err)
	}
}

// Shutdown stops node i gracefully (leadership transfer first).
func (c *Coordinators) Shutdown(i int) {
	c.t.Helper()
	c.mu.Lock()
	n := c.slots[i].node
	c.slots[i].node = nil
	c.mu.Unlock()
	if n == nil {
		c.t.Fatalf("harness: shut down node%d: not running", i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		c.t.Logf("harness: shut down node%d: %v", i, err)
	}
}

// Restart starts node i again on its data dir and addresses.
func (c *Coordinators) Restart(i int) {
	c.t.Helper()
	if c.Node(i) != nil {
		c.t.Fatalf("harness: restart node%d: still running", i)
	}
	c.start(i, false)
}

// Remove takes node i out of the cluster through the admin API (followed
// to the leader), then stops it.
func (c *Coordinators) Remove(i int) {
	c.t.Helper()
	c.mu.Lock()
	id := c.slots[i].cfg.ID
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), raftWait)
	defer cancel()
	cl := coordinator.NewClient(c.liveAdminAddrs(), coordinator.ClientOptions{DialOptions: c.AdminDialOptions()})
	defer cl.Close()
	if _, err := cl.RemoveServer(ctx, &rationv1.RemoveServerRequest{Id: id}); err != nil {
		c.t.Fatalf("harness: remove node%d: %v", i, err)
	}
	if c.Node(i) != nil {
		c.Kill(i)
	}
}

// Add starts node i again with an empty data dir and joins it through a
// live member's admin address, as a new server would be. It returns once
// the node is a voter (it may still be catching up).
func (c *Coordinators) Add(i int) {
	c.t.Helper()
	if c.Node(i) != nil {
		c.t.Fatalf("harness: add node%d: still running", i)
	}
	live := c.liveAdminAddrs()
	if len(live) == 0 {
		c.t.Fatalf("harness: add node%d: no live member to join through", i)
	}
	c.mu.Lock()
	c.slots[i].cfg.Bootstrap = false
	c.slots[i].cfg.Join = live[0]
	id := c.slots[i].cfg.ID
	c.mu.Unlock()
	if c.pki != nil {
		// Remove withdrew its registration: the operator registers it
		// again before it joins with its own certificate.
		ctx, cancel := context.WithTimeout(context.Background(), raftWait)
		defer cancel()
		cl := coordinator.NewClient(live, coordinator.ClientOptions{DialOptions: c.AdminDialOptions()})
		defer cl.Close()
		if _, err := cl.AllowMember(ctx, &rationv1.AllowMemberRequest{Id: id}); err != nil {
			c.t.Fatalf("harness: add node%d: allow: %v", i, err)
		}
	}
	c.start(i, true)
	c.WaitVoters(c.t, len(c.Live()))
}

func (c *Coordinators) liveAdminAddrs() []string {
	var out []string
	for _, j := range c.Live() {
		out = append(out, c.Node(j).AdminAddr())
	}
	return out
}

// SetRules gives every node set, as a rules reload (SIGHUP) on each would:
// the live nodes at once, and a node killed now starts again with it
// (Restart, Add) rather than with the rules it was first started with.
func (c *Coordinators) SetRules(set *rules.Set) {
	c.mu.Lock()
	c.rules = set
	var live []*coordinator.Node
	for _, s := range c.slots {
		s.cfg.Rules = set
		if s.node != nil {
			live = append(live, s.node)
		}
	}
	c.mu.Unlock()
	for _, n := range live {
		n.SetRules(set)
	}
}

// Config returns node i's configuration (its addresses as bound).
func (c *Coordinators) Config(i int) coordinator.Config {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.slots[i].cfg
}

// Client returns a Client for all nodes, closed at cleanup.
func (c *Coordinators) Client(opts coordinator.ClientOptions) *coordinator.Client {
	cl := coordinator.NewClient(c.GRPCAddrs(), opts)
	c.mu.Lock()
	c.clients = append(c.clients, cl)
	c.mu.Unlock()
	return cl
}

// Converged waits until every live node has applied the same last index
// with byte-identical lease states, and returns that state's encoding and
// index. Two nodes at the same index with different states fail the test
// at once: the replicas diverged.
func (c *Coordinators) Converged(t testing.TB) ([]byte, uint64) {
	t.Helper()
	var state []byte
	var index uint64
	c.waitUntil(t, "replicas to converge", func() (bool, string) {
		var first []byte
		var firstIdx uint64
		var why []string
		same := true
		for k, j := range c.Live() {
			b, idx, err := c.Node(j).FSM().StateBinary()
			if err != nil {
				t.Fatalf("harness: node%d: encode state: %v", j, err)
			}
			if k == 0 {
				first, firstIdx = b, idx
				continue
			}
			if idx != firstIdx {
				same = false
				why = append(why, fmt.Sprintf("node%d at %d, first live at %d", j, idx, firstIdx))
				continue
			}
			if !bytes.Equal(b, first) {
				t.Fatalf("harness: node%d and the first live node applied index %d but their states differ:\n%s\n---\n%s", j, idx, b, first)
			}
		}
		state, index = first, firstIdx
		return same, strings.Join(why, "; ")
	})
	return state, index
}

func (c *Coordinators) waitUntil(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(raftWait)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("harness: waited %v for %s (last: %s)", raftWait, what, why)
		}
		time.Sleep(raftPoll)
	}
}

func (c *Coordinators) stopAll() {
	c.mu.Lock()
	clients := c.clients
	c.clients = nil
	c.mu.Unlock()
	for _, cl := range clients {
		cl.Close()
	}
	var wg sync.WaitGroup
	for i := range c.slots {
		c.mu.Lock()
		n := c.slots[i].node
		c.slots[i].node = nil
		c.mu.Unlock()
		if n != nil {
			wg.Add(1)
			go func() { defer wg.Done(); n.Close() }()
		}
	}
	wg.Wait()
}

// testLog writes node logs to t.Log until the test ends; a Raft goroutine
// that logs after that is dropped instead of panicking the test binary.
type testLog struct {
	t     testing.TB
	level slog.Level
	mu    sync.Mutex
	done  bool
}

func newTestLog(t testing.TB) *testLog {
	l := &testLog{t: t, level: slog.LevelWarn}
	switch strings.ToLower(os.Getenv("RATION_TEST_LOG")) {
	case "debug":
		l.level = slog.LevelDebug
	case "info":
		l.level = slog.LevelInfo
	case "error":
		l.level = slog.LevelError
	}
	// Registered before the nodes' cleanups, so it runs after them.
	t.Cleanup(func() {
		l.mu.Lock()
		l.done = true
		l.mu.Unlock()
	})
	return l
}

func (l *testLog) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: l.level}))
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}
