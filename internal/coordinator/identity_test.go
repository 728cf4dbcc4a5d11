package coordinator_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"

	"github.com/ration-dev/ration/internal/certgen"
	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/rules"
	"github.com/ration-dev/ration/internal/tlsfiles"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Every group of a fleet has coordinators, all signed by the one CA, and
// the pods of every group have the same names (coordinator-0..2). The
// tests below run the global group and, against it, a rogue holding each
// kind of certificate the fleet issues.

// rogueCerts are the certificates of the fleet that are not a member of
// the global group's configuration, or are used for another member.
// handshake: the Raft port refuses it at the TLS handshake (it names no
// member of the group); otherwise it gets through the handshake and each
// RPC is refused for its header.
func rogueCerts(pki *harness.PKI) []struct {
	name      string
	f         tlsfiles.Files
	id        string // the server id its RPCs claim
	realAddr  bool   // its RPCs claim id's own Raft address (else the rogue's)
	handshake bool
} {
	return []struct {
		name      string
		f         tlsfiles.Files
		id        string
		realAddr  bool
		handshake bool
	}{
		{"another group's coordinator", pki.Member("eu", "eu1", tlsfiles.URI(tlsfiles.RoleRegion, "eu")), "eu1", false, true},
		{"another group's coordinator with a member's id", pki.Member("eu", "node1", tlsfiles.URI(tlsfiles.RoleRegion, "eu")), "node1", false, true},
		{"a coordinator of the form before groups", pki.Issue("old-node1", tlsfiles.URI(tlsfiles.RoleCoordinator, "node1")), "node1", false, true},
		{"a region", pki.Issue("region-us", tlsfiles.URI(tlsfiles.RoleRegion, "us")), "node1", false, true},
		{"an agent", pki.Agent("node1"), "node1", false, true},
		{"an operator", pki.Operator("node1"), "node1", false, true},
		{"this group's coordinator, not a member", pki.Member(tlsfiles.GlobalGroup, "node9"), "node9", false, false},
		{"a member speaking for another", pki.Member(tlsfiles.GlobalGroup, "node1"), "node2", true, false},
		{"a member from another address", pki.Member(tlsfiles.GlobalGroup, "node1"), "node1", false, false},
	}
}

// raftAddrOf is the Raft address of node id of c.
func raftAddrOf(c *harness.Coordinators, id string) string {
	for i := range c.N() {
		if c.Config(i).ID == id {
			return c.Config(i).RaftAddr
		}
	}
	return ""
}

func raftTerm(n *coordinator.Node) uint64 {
	t, _ := strconv.ParseUint(n.Raft().Stats()["term"], 10, 64)
	return t
}

// raftAttacks are the RPCs a rogue sends to n, each with a term far above
// the group's: a leader that took any of them would step down
// (AppendEntries, RequestVote), a follower would start an election
// (TimeoutNow), and the AppendEntries carries an entry that follows n's
// log, committed at once (a no-op, so that a check missing shows as these
// RPCs answered rather than as a node stopped on an entry it cannot apply).
func raftAttacks(tr *raft.NetworkTransport, hdr raft.RPCHeader, term uint64, n *coordinator.Node) []struct {
	name string
	send func() error
} {
	id, addr := raft.ServerID(n.ID()), raft.ServerAddress(n.RaftAddr())
	return []struct {
		name string
		send func() error
	}{
		{"AppendEntries", func() error {
			stats := n.Raft().Stats()
			last, _ := strconv.ParseUint(stats["last_log_index"], 10, 64)
			lastTerm, _ := strconv.ParseUint(stats["last_log_term"], 10, 64)
			return tr.AppendEntries(id, addr, &raft.AppendEntriesRequest{RPCHeader: hdr, Term: term,
				PrevLogEntry: last, PrevLogTerm: lastTerm,
				Entries:           []*raft.Log{{Index: last + 1, Term: term, Type: raft.LogNoop}},
				LeaderCommitIndex: last + 1}, &raft.AppendEntriesResponse{})
		}},
		{"RequestVote", func() error {
			return tr.RequestVote(id, addr, &raft.RequestVoteRequest{RPCHeader: hdr, Term: term, LastLogIndex: 1 << 40, LastLogTerm: term}, &raft.RequestVoteResponse{})
		}},
		{"TimeoutNow", func() error {
			return tr.TimeoutNow(id, addr, &raft.TimeoutNowRequest{RPCHeader: hdr}, &raft.TimeoutNowResponse{})
		}},
	}
}

// TestRaftPortAdmitsOnlyMembers: a rogue with each certificate of the
// fleet dials the leader's and a follower's Raft port and sends
// AppendEntries, RequestVote and TimeoutNow with a term 1000 above the
// group's. Each is refused: at the handshake when the certificate names no
// member of the global group (a TLS alert), otherwise RPC by RPC when its
// header names an id the certificate does not, one not in the
// configuration, or another address than the configuration's (the
// connection closed unanswered). No node's term comes
// near the rogue's and the leader stays. A member's own certificate with
// its own id gets an answer over the same client: the refusals are the
// checks', not the client's.
func TestRaftPortAdmitsOnlyMembers(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 3, testRules, pki, noTicks)
	li, ln := c.Leader(t)
	targets := []*coordinator.Node{ln, c.Node((li + 1) % 3)}
	rogueTerm := raftTerm(ln) + 1000

	for _, rc := range rogueCerts(pki) {
		t.Run(rc.name, func(t *testing.T) {
			tr := harness.RogueRaftClient(t, pki, rc.f)
			addr := string(tr.LocalAddr())
			if rc.realAddr {
				addr = raftAddrOf(c, rc.id)
			}
			hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(rc.id), Addr: []byte(addr)}
			for _, n := range targets {
				for _, a := range raftAttacks(tr, hdr, rogueTerm, n) {
					err := a.send()
					switch {
					case err == nil:
						t.Errorf("%s to %s: answered, want refused", a.name, n.ID())
					case rc.handshake && !strings.Contains(err.Error(), "tls:"):
						t.Errorf("%s to %s: %v, want refused at the TLS handshake", a.name, n.ID(), err)
					case !rc.handshake && strings.Contains(err.Error(), "tls:"):
						t.Errorf("%s to %s: %v, want the handshake passed and the RPC refused", a.name, n.ID(), err)
					}
				}
			}
		})
	}
	// The RPCs refused after the handshake are counted where they were
	// refused: three cases, three RPCs each, to two nodes.
	refused := 0.0
	for i := range c.N() {
		refused += harness.Counter(t, c.Registry(i), "ration_coordinator_raft_rpcs_refused_total")
	}
	if refused != 3*3*2 {
		t.Errorf("ration_coordinator_raft_rpcs_refused_total sums to %v over the nodes, want 18", refused)
	}
	for i := range c.N() {
		if term := raftTerm(c.Node(i)); term >= rogueTerm {
			t.Errorf("%s is at term %d: a rogue's RPC (term %d) got through", c.Node(i).ID(), term, rogueTerm)
		}
	}
	if li2, _ := c.Leader(t); li2 != li {
		t.Errorf("node%d leads, was node%d", li2, li)
	}

	// The same client with a member's certificate and its own id: a
	// RequestVote of term 0 is answered (and refused by Raft for its term).
	member := c.Node((li + 2) % 3)
	tr := harness.RogueRaftClient(t, pki, pki.Member(tlsfiles.GlobalGroup, member.ID()))
	hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(member.ID()), Addr: []byte(member.RaftAddr())}
	var resp raft.RequestVoteResponse
	if err := tr.RequestVote(raft.ServerID(ln.ID()), raft.ServerAddress(ln.RaftAddr()), &raft.RequestVoteRequest{RPCHeader: hdr}, &resp); err != nil {
		t.Fatalf("a member's stale RequestVote: %v, want an answer", err)
	}
	if resp.Granted {
		t.Fatal("a stale RequestVote was granted")
	}
}

// TestRaftDialsOnlyTheMember: a follower goes down and a rogue listens on
// its Raft address, with the certificate of another group's member of the
// same id, of another member of this group, or of an agent. The leader
// keeps dialing the address and sends the rogue nothing: it checks that
// the server there is the member its configuration has there.
func TestRaftDialsOnlyTheMember(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 3, testRules, pki, noTicks)
	li, _ := c.Leader(t)
	fi := (li + 1) % 3
	victim := c.Config(fi)
	c.Kill(fi)
	for _, tc := range []struct {
		name string
		f    tlsfiles.Files
	}{
		{"another group's member of the same id", pki.Member("eu", victim.ID)},
		{"another member of this group", pki.Member(tlsfiles.GlobalGroup, c.Config(li).ID)},
		{"an agent", pki.Agent(victim.ID)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", victim.RaftAddr)
			if err != nil {
				t.Fatalf("listen on the follower's Raft address: %v", err)
			}
			r := harness.StartRogueRaft(t, pki, lis, tc.f)
			deadline := time.Now().Add(30 * time.Second)
			for r.Conns() < 3 && r.Bytes() == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the leader dialed the rogue %d times in 30s", r.Conns())
				}
				time.Sleep(10 * time.Millisecond)
			}
			if r.Bytes() != 0 || r.Handshakes() != 0 {
				t.Fatalf("the leader completed %d handshakes with the rogue and sent it %d bytes of RPCs", r.Handshakes(), r.Bytes())
			}
			lis.Close()
		})
	}
}

// TestAdminRefusesCoordinators: the admin calls a member of another group
// made against the global group (Tune of another region; AddVoter with a
// member's id and new addresses, which would send that member's clients,
// and the CLI with its token, to a host of the caller's choosing), and
// the same by this group's own members for anyone but themselves, are
// refused PERMISSION_DENIED, and the tunings and members stay as they
// were. A member adding itself (what -join does) goes through.
func TestAdminRefusesCoordinators(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 3, hierRules, pki, noTicks)
	li, ln := c.Leader(t)
	ctx := timeout(t, 60*time.Second)
	before := adminState(t, c)
	victim := c.Config((li + 1) % 3)
	self := c.Config((li + 2) % 3)
	rewrite := func(id string) func(context.Context, rationv1.AdminClient) error {
		return func(ctx context.Context, a rationv1.AdminClient) error {
			raftAddr := raftAddrOf(c, id)
			if raftAddr == "" {
				raftAddr = "evil.example:8300"
			}
			_, err := a.AddVoter(ctx, &rationv1.AddVoterRequest{Id: id, RaftAddress: raftAddr,
				GrpcAddress: "evil.example:8301", AdminAddress: "evil.example:8303"})
			return err
		}
	}
	tuneUS := func(ctx context.Context, a rationv1.AdminClient) error {
		w := 0.001
		_, err := a.Tune(ctx, &rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "g", Region: "us", Weight: &w}})
		return err
	}
	status := func(ctx context.Context, a rationv1.AdminClient) error {
		_, err := a.Status(ctx, &rationv1.StatusRequest{})
		return err
	}
	type attack struct {
		name string
		call func(context.Context, rationv1.AdminClient) error
	}
	for _, tc := range []struct {
		name    string
		f       tlsfiles.Files
		attacks []attack
	}{
		{"another group's coordinator", pki.Member("eu", "eu1", tlsfiles.URI(tlsfiles.RoleRegion, "eu")),
			[]attack{{"Tune region us", tuneUS}, {"AddVoter rewriting " + victim.ID, rewrite(victim.ID)}, {"AddVoter of itself", rewrite("eu1")}, {"Status", status}}},
		{"another group's coordinator with a member's id", pki.Member("eu", victim.ID),
			[]attack{{"AddVoter rewriting " + victim.ID, rewrite(victim.ID)}, {"Tune region us", tuneUS}}},
		{"a coordinator of the form before groups", pki.Issue("old", tlsfiles.URI(tlsfiles.RoleCoordinator, victim.ID)),
			[]attack{{"AddVoter rewriting " + victim.ID, rewrite(victim.ID)}}},
		{"a member of this group", pki.Member(tlsfiles.GlobalGroup, self.ID),
			[]attack{{"AddVoter rewriting " + victim.ID, rewrite(victim.ID)}, {"Tune region us", tuneUS}}},
		{"a region", pki.Issue("region-us", tlsfiles.URI(tlsfiles.RoleRegion, "us")),
			[]attack{{"Tune region us", tuneUS}, {"AddVoter rewriting " + victim.ID, rewrite(victim.ID)}}},
		{"an agent", pki.Agent(victim.ID),
			[]attack{{"AddVoter rewriting " + victim.ID, rewrite(victim.ID)}, {"Tune region us", tuneUS}}},
		{"an agent with the operator role as its URI's host", pki.Issue("agent-at-operator", "ration://agent@operator/ops"),
			[]attack{{"Tune region us", tuneUS}, {"Status", status}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := adminWith(t, ln.AdminAddr(), pki.DialOptions(tc.f))
			for _, at := range tc.attacks {
				wantRefused(t, at.name, at.call(ctx, a), codes.PermissionDenied, "operator")
			}
		})
	}
	if after := adminState(t, c); after != before {
		t.Fatalf("refused admin calls changed the state:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// A member adding itself again, at the addresses it has: a no-op that
	// goes through, as a retried -join.
	a := adminWith(t, ln.AdminAddr(), pki.DialOptions(pki.Member(tlsfiles.GlobalGroup, self.ID)))
	n := c.Node((li + 2) % 3)
	if _, err := a.AddVoter(ctx, &rationv1.AddVoterRequest{Id: self.ID, RaftAddress: n.RaftAddr(), GrpcAddress: n.GRPCAddr(), AdminAddress: n.AdminAddr()}); err != nil {
		t.Fatalf("a member's AddVoter of itself: %v", err)
	}
	if after := adminState(t, c); after != before {
		t.Fatalf("a member's AddVoter of itself at its own addresses changed the state:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestCoordinatorStartsOnlyAsItself: a node refuses to start with a
// certificate that does not name it as a member of its group: an agent's,
// another group's member of the same id, or a coordinator's of the form
// before groups (whose error says to re-issue it).
func TestCoordinatorStartsOnlyAsItself(t *testing.T) {
	pki := harness.NewPKI(t)
	for _, tc := range []struct {
		name   string
		region string
		f      tlsfiles.Files
		want   string
	}{
		{"an agent's", "", pki.Agent("n1"), `needs URI SAN ration://coordinator/global/n1`},
		{"another group's", "", pki.Member("eu", "n1"), `needs URI SAN ration://coordinator/global/n1`},
		{"the global group's, in a regional group", "eu", pki.Member(tlsfiles.GlobalGroup, "n1"), `needs URI SAN ration://coordinator/eu/n1`},
		{"before groups", "", pki.Issue("old", tlsfiles.URI(tlsfiles.RoleCoordinator, "n1")), `the form before identities were scoped to their group: re-issue`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := harness.RaftTestConfig()
			cfg.ID, cfg.Region, cfg.Bootstrap, cfg.DataDir = "n1", tc.region, true, t.TempDir()
			cfg.Rules, cfg.Insecure, cfg.TLS = mustRules(t, testRules), false, tc.f
			n, err := coordinator.Start(context.Background(), cfg, nil, nil)
			if err == nil {
				n.Close()
				t.Fatal("started")
			}
			if !errors.Is(err, coordinator.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v, want ErrInvalidConfig saying %q", err, tc.want)
			}
		})
	}
}

// TestRotationKeepsTheNodesIdentity: a rotation that writes an agent's
// certificate, or another member's, or an expired one of the node itself,
// over a running node's files is refused: the node keeps presenting its
// own certificate and serving, and the next good one goes in force.
func TestRotationKeepsTheNodesIdentity(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 1, testRules, pki, noTicks)
	i, n := c.Leader(t)
	cfg := c.Config(i)
	src := n.TLSSource()
	own := src.Leaf().SerialNumber
	ctx := timeout(t, 60*time.Second)
	agent := tlsClient(c, pki, pki.Agent("alice"))
	h := newHolder("alice/1")
	for _, tc := range []struct {
		name  string
		write func()
	}{
		{"an agent's", func() { pki.Reissue(cfg.TLS, "rogue", tlsfiles.URI(tlsfiles.RoleAgent, cfg.ID)) }},
		{"another member's", func() { pki.Reissue(cfg.TLS, "rogue", tlsfiles.CoordinatorURI(tlsfiles.GlobalGroup, "other")) }},
		{"its own, expired", func() {
			pki.ReissueWith(cfg.TLS, certgen.Request{CommonName: "expired", URIs: []string{tlsfiles.CoordinatorURI(tlsfiles.GlobalGroup, cfg.ID)},
				DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, NotAfter: time.Now().Add(-time.Minute)})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failures, reloads := src.Failures(), src.Reloads()
			tc.write()
			// Until the node has read the new files, refusing or taking them.
			for src.Failures() == failures && src.Reloads() == reloads {
				time.Sleep(10 * time.Millisecond)
			}
			if src.Leaf().SerialNumber.Cmp(own) != 0 {
				t.Fatal("the refused certificate is in force")
			}
			req := h.request(testQuotas[:1], 1)
			resp, err := agent.Renew(ctx, req)
			if err != nil {
				t.Fatalf("an agent renews after the refused rotation: %v", err)
			}
			if err := h.adopt(req, resp); err != nil {
				t.Fatal(err)
			}
		})
	}
	pki.Reissue(cfg.TLS, "next", tlsfiles.CoordinatorURI(tlsfiles.GlobalGroup, cfg.ID))
	for src.Leaf().SerialNumber.Cmp(own) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCoordinatorClientsRequireACoordinator: a node's -join and its
// -upstream dial servers whose certificates are not a coordinator's of the
// group they mean (an agent's; a regional group's coordinator posing as
// the global group; another group's posing as this one): the handshake
// fails, and no call reaches them, so neither the admin token nor a
// renewal is sent.
func TestCoordinatorClientsRequireACoordinator(t *testing.T) {
	pki := harness.NewPKI(t)
	file, _ := harness.AdminToken(t)
	for _, tc := range []struct {
		name string
		f    tlsfiles.Files
	}{
		{"an agent's", pki.Agent("node0")},
		{"another group's coordinator", pki.Member("eu", "node0")},
	} {
		t.Run("join "+tc.name, func(t *testing.T) {
			rogue := harness.StartRogue(t, pki, tc.f)
			cfg := harness.RaftTestConfig()
			cfg.ID, cfg.Join, cfg.DataDir, cfg.AdminTokenFile = "node1", rogue.Addr, t.TempDir(), file
			cfg.Rules = mustRules(t, testRules)
			pki.Coordinator(&cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			n, err := coordinator.Start(ctx, cfg, nil, nil)
			if err == nil {
				n.Close()
				t.Fatal("joined through the rogue")
			}
			if rogue.Conns() == 0 {
				t.Fatalf("the rogue was never dialed: %v", err)
			}
			if calls, toks := rogue.Calls(), rogue.Tokens(); len(calls)+len(toks) != 0 {
				t.Fatalf("the rogue received calls %q with tokens %q", calls, toks)
			}
		})
	}
	for _, tc := range []struct {
		name string
		f    tlsfiles.Files
	}{
		{"an agent's", pki.Agent("node0")},
		{"a regional group's coordinator", pki.Member("us", "node0", tlsfiles.URI(tlsfiles.RoleRegion, "us"))},
	} {
		t.Run("upstream "+tc.name, func(t *testing.T) {
			rogue := harness.StartRogue(t, pki, tc.f)
			c := harness.StartCoordinatorsTLS(t, 1, hierRules, pki, func(cfg *coordinator.Config) {
				cfg.Region, cfg.Upstream = "eu", rogue.Addr
			})
			c.Leader(t)
			deadline := time.Now().Add(30 * time.Second)
			for rogue.Conns() < 2 && len(rogue.Calls()) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the regional leader dialed the upstream rogue %d times in 30s", rogue.Conns())
				}
				time.Sleep(10 * time.Millisecond)
			}
			if calls := rogue.Calls(); len(calls) != 0 {
				t.Fatalf("the rogue upstream received calls %q", calls)
			}
		})
	}
}

func mustRules(t *testing.T, yaml string) *rules.Set {
	t.Helper()
	set, err := rules.Parse("rules.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	return set
}
