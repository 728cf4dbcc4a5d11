package coordinator_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// configuration is n's Raft configuration: id to suffrage.
func configuration(t *testing.T, n *coordinator.Node) map[string]raft.ServerSuffrage {
	t.Helper()
	f := n.Raft().GetConfiguration()
	if err := f.Error(); err != nil {
		t.Fatalf("configuration: %v", err)
	}
	out := map[string]raft.ServerSuffrage{}
	for _, s := range f.Configuration().Servers {
		out[string(s.ID)] = s.Suffrage
	}
	return out
}

// deadAddr is an address nothing listens on (a listener closed at once:
// its port is not handed out again while the test runs, nearly always,
// and a process that took it would answer with no Raft or TLS).
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// commits reports whether the leader still commits: an operator's Tune
// goes through (a group without its quorum cannot).
func commits(ctx context.Context, a rationv1.AdminClient) error {
	w := 0.5
	_, err := a.Tune(ctx, &rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "g", Region: "us", Weight: &w}})
	return err
}

// A certificate of the group for a server that never was a member
// ("ghost") can neither add itself nor read Status: membership, not the
// group in a name, admits. Added at a dead address, a single-node group
// lost its quorum at once.
func TestNeverMemberCannotAddItself(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 1, hierRules, pki, noTicks)
	_, ln := c.Leader(t)
	ctx := timeout(t, 60*time.Second)
	before := configuration(t, ln)

	ghost := adminWith(t, ln.AdminAddr(), pki.DialOptions(pki.Member(tlsfiles.GlobalGroup, "ghost")))
	dead := deadAddr(t)
	_, err := ghost.AddVoter(ctx, &rationv1.AddVoterRequest{Id: "ghost", RaftAddress: dead, GrpcAddress: dead, AdminAddress: dead})
	wantRefused(t, "a never-member's AddVoter of itself", err, codes.PermissionDenied, "neither a member nor registered")
	_, err = ghost.Status(ctx, &rationv1.StatusRequest{})
	wantRefused(t, "a never-member's Status", err, codes.PermissionDenied, "none of them a member or registered")

	if after := configuration(t, ln); !maps.Equal(before, after) {
		t.Fatalf("configuration %v after refused calls, was %v", after, before)
	}
	op := c.LeaderAdmin(t)
	if err := commits(ctx, op); err != nil {
		t.Fatalf("the group no longer commits: %v", err)
	}
}

// A member the operator removed stays out: its certificate, valid until
// it expires, cannot add it back, until an operator registers it again
// (coordinator members allow), after which it joins and is promoted.
func TestRemovedMemberStaysOut(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 3, hierRules, pki, noTicks)
	li, ln := c.Leader(t)
	ctx := timeout(t, 90*time.Second)
	gone := (li + 1) % 3
	id := c.Config(gone).ID
	raftAddr, grpcAddr, adminAddr := c.Node(gone).RaftAddr(), c.Node(gone).GRPCAddr(), c.Node(gone).AdminAddr()
	c.Remove(gone)

	removed := adminWith(t, ln.AdminAddr(), pki.DialOptions(pki.Member(tlsfiles.GlobalGroup, id)))
	_, err := removed.AddVoter(ctx, &rationv1.AddVoterRequest{Id: id, RaftAddress: raftAddr, GrpcAddress: grpcAddr, AdminAddress: adminAddr})
	wantRefused(t, "a removed member's AddVoter of itself", err, codes.PermissionDenied, "neither a member nor registered")
	if got := configuration(t, ln); len(got) != 2 {
		t.Fatalf("configuration %v after a removed member's refused AddVoter, want the 2 members left", got)
	}
	m, err := c.LeaderAdmin(t).AllowMember(ctx, &rationv1.AllowMemberRequest{}) // bad input: no id
	wantRefused(t, "AllowMember without an id", err, codes.InvalidArgument, "id")
	if m != nil {
		t.Errorf("a refused AllowMember answered %v", m)
	}
	// Re-registered by the operator (Add calls AllowMember), it joins
	// again and is promoted to voter (Add waits for 3 voters).
	c.Add(gone)
	got := configuration(t, ln)
	if got[id] != raft.Voter || len(got) != 3 {
		t.Fatalf("configuration %v, want %s back as a voter", got, id)
	}
}

// A server added at an address that never answers is a non-voter and
// stays one: it counts toward no quorum, and the single node keeps
// committing. Registered or added by an operator, the server is trusted,
// but its address may still be wrong.
func TestDeadServerNeverVotes(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 1, hierRules, pki, noTicks)
	_, ln := c.Leader(t)
	ctx := timeout(t, 60*time.Second)
	op := c.LeaderAdmin(t)

	if _, err := op.AllowMember(ctx, &rationv1.AllowMemberRequest{Id: "node1"}); err != nil {
		t.Fatalf("allow node1: %v", err)
	}
	self := adminWith(t, ln.AdminAddr(), pki.DialOptions(pki.Member(tlsfiles.GlobalGroup, "node1")))
	dead := deadAddr(t)
	resp, err := self.AddVoter(ctx, &rationv1.AddVoterRequest{Id: "node1", RaftAddress: dead, GrpcAddress: dead, AdminAddress: dead})
	if err != nil {
		t.Fatalf("a registered server's AddVoter of itself: %v", err)
	}
	if !slices.Contains(resp.GetAllowed(), "node1") {
		t.Errorf("membership's allowed %v, want node1 in it", resp.GetAllowed())
	}
	// Wait for the leader's probes of it to fail: each round is where
	// a caught-up non-voter would be promoted.
	if waitFor(30*time.Second, func() bool { return health(t, ctx, op, "node1") == "unreachable" }) == 0 {
		t.Fatalf("node1's health is %q, want unreachable", health(t, ctx, op, "node1"))
	}
	if got := configuration(t, ln); got["node1"] != raft.Nonvoter {
		t.Fatalf("configuration %v: a server that never answered is %v, want a non-voter", got, got["node1"])
	}
	if err := commits(ctx, op); err != nil {
		t.Fatalf("the group no longer commits with a dead server added: %v", err)
	}
}

// health is member id's health as the leader's Status reports it.
func health(t *testing.T, ctx context.Context, a rationv1.AdminClient, id string) string {
	t.Helper()
	st, err := a.Status(ctx, &rationv1.StatusRequest{})
	if err != nil {
		return err.Error()
	}
	for _, s := range st.GetServers() {
		if s.GetId() == id {
			return s.GetHealth()
		}
	}
	return "absent"
}

// serveAdmin serves srv as an admin API over mutual TLS with the
// certificate files, on a listener of its own, and returns its address.
func serveAdmin(t *testing.T, pki *harness.PKI, files tlsfiles.Files, srv rationv1.AdminServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(pki.Source(files).ServerCredentials(nil)))
	rationv1.RegisterAdminServer(g, srv)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// countingAdmin is an admin API that counts the calls that reach it.
type countingAdmin struct {
	rationv1.UnimplementedAdminServer
	calls atomic.Int64
}

func (a *countingAdmin) Status(context.Context, *rationv1.StatusRequest) (*rationv1.StatusResponse, error) {
	a.calls.Add(1)
	return &rationv1.StatusResponse{AppliedIndex: 1 << 40}, nil
}

// The health prober dials a member's admin address requiring that
// member's own certificate: an admin address served with another
// certificate of the group (a ghost's) gets no call, and so neither the
// group's admin token nor an applied index that would promote it.
func TestProbesRequireTheMembersCertificate(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 1, hierRules, pki, noTicks)
	_, ln := c.Leader(t)
	ctx := timeout(t, 60*time.Second)
	op := c.LeaderAdmin(t)

	ghost := &countingAdmin{}
	admin := serveAdmin(t, pki, pki.Member(tlsfiles.GlobalGroup, "ghost"), ghost)

	dead := deadAddr(t)
	if _, err := op.AddVoter(ctx, &rationv1.AddVoterRequest{Id: "node1", RaftAddress: dead, GrpcAddress: dead, AdminAddress: admin}); err != nil {
		t.Fatalf("add node1: %v", err)
	}
	if waitFor(30*time.Second, func() bool { return health(t, ctx, op, "node1") == "unreachable" }) == 0 {
		t.Fatalf("node1's health is %q, want unreachable (its admin address presents a ghost's certificate)", health(t, ctx, op, "node1"))
	}
	if n := ghost.calls.Load(); n != 0 {
		t.Errorf("the ghost at node1's admin address got %d Status calls, want 0", n)
	}
	if got := configuration(t, ln); got["node1"] != raft.Nonvoter {
		t.Errorf("configuration %v: node1 is %v, want a non-voter", got, got["node1"])
	}
}

// A member adding itself again and again while an operator removes it
// stays out once the removal returns: its own AddVoter never registers
// it, and membership changes are made one at a time on the leader, each
// self-add checked again under that order. Before, a self-add admitted
// just before the removal re-registered the member, or landed after it.
func TestRemovalRacedBySelfAddsStaysRemoved(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 1, hierRules, pki, noTicks)
	_, ln := c.Leader(t)
	ctx := timeout(t, 120*time.Second)
	op := c.LeaderAdmin(t)
	for trial := range 5 {
		id := fmt.Sprintf("victim%d", trial)
		dead := deadAddr(t)
		add := &rationv1.AddVoterRequest{Id: id, RaftAddress: dead, GrpcAddress: dead, AdminAddress: dead}
		if _, err := op.AddVoter(ctx, add); err != nil {
			t.Fatalf("add %s: %v", id, err)
		}
		self := adminWith(t, ln.AdminAddr(), pki.DialOptions(pki.Member(tlsfiles.GlobalGroup, id)))
		var admitted atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 500; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := self.AddVoter(ctx, add); err == nil {
						admitted.Add(1)
					}
				}
			}()
		}
		// The removal waits for the self-adds in flight (one change at a
		// time): it starts once some went through.
		if waitFor(30*time.Second, func() bool { return admitted.Load() > 0 }) == 0 {
			t.Fatalf("%s: no self-add went through before the removal", id)
		}
		if _, err := op.RemoveServer(ctx, &rationv1.RemoveServerRequest{Id: id}); err != nil {
			t.Fatalf("remove %s: %v", id, err)
		}
		close(stop)
		wg.Wait()
		_, err := self.AddVoter(ctx, add)
		wantRefused(t, id+"'s AddVoter of itself after its removal", err, codes.PermissionDenied, "neither a member nor registered")
		if got := configuration(t, ln); len(got) != 1 {
			t.Fatalf("trial %d: configuration %v after %s's removal, want the leader alone", trial, got, id)
		}
	}
}

// A server added without an admin address is refused: the leader
// promotes a server once its probe there finds it caught up, and one with
// none was promoted at once (a dead Raft address then voted).
func TestAddWithoutAdminAddressRefused(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 1, hierRules, pki, noTicks)
	_, ln := c.Leader(t)
	ctx := timeout(t, 60*time.Second)
	before := configuration(t, ln)
	dead := deadAddr(t)
	_, err := c.LeaderAdmin(t).AddVoter(ctx, &rationv1.AddVoterRequest{Id: "node1", RaftAddress: dead, GrpcAddress: dead})
	wantRefused(t, "AddVoter without an admin address", err, codes.InvalidArgument, "admin_address is empty")
	if after := configuration(t, ln); !maps.Equal(before, after) {
		t.Fatalf("configuration %v after a refused AddVoter, was %v", after, before)
	}
}

// A server whose admin address answers with its own certificate and an
// applied index far ahead, but whose Raft address is dead, is not
// promoted: the leader's heartbeats to it fail. Its Status alone is not
// evidence that it has the log.
func TestDeadRaftAddressNotPromotedOnItsWord(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 1, hierRules, pki, noTicks)
	_, ln := c.Leader(t)
	ctx := timeout(t, 60*time.Second)
	op := c.LeaderAdmin(t)
	liar := &countingAdmin{}
	admin := serveAdmin(t, pki, pki.Member(tlsfiles.GlobalGroup, "node1"), liar)
	dead := deadAddr(t)
	if _, err := op.AddVoter(ctx, &rationv1.AddVoterRequest{Id: "node1", RaftAddress: dead, GrpcAddress: dead, AdminAddress: admin}); err != nil {
		t.Fatalf("add node1: %v", err)
	}
	// Several probe rounds answered, each a chance to promote it.
	if waitFor(30*time.Second, func() bool { return liar.calls.Load() >= 4 }) == 0 {
		t.Fatalf("node1's admin address got %d probes, want 4", liar.calls.Load())
	}
	if got := configuration(t, ln); got["node1"] != raft.Nonvoter {
		t.Fatalf("configuration %v: node1 (dead Raft address, Status claiming the log) is %v, want a non-voter", got, got["node1"])
	}
	if err := commits(ctx, op); err != nil {
		t.Fatalf("the group no longer commits: %v", err)
	}
}

// Two member records naming one admin address (a ghost added with a
// follower's) do not make the follower unreachable: each member's probe
// has a connection of its own, requiring its own certificate.
func TestSharedAdminAddressKeepsTheMemberReachable(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 3, hierRules, pki, noTicks)
	li, _ := c.Leader(t)
	ctx := timeout(t, 60*time.Second)
	op := c.LeaderAdmin(t)
	f := (li + 1) % 3
	follower := c.Config(f).ID
	dead := deadAddr(t)
	if _, err := op.AddVoter(ctx, &rationv1.AddVoterRequest{Id: "ghost", RaftAddress: dead, GrpcAddress: dead, AdminAddress: c.Node(f).AdminAddr()}); err != nil {
		t.Fatalf("add ghost: %v", err)
	}
	if waitFor(30*time.Second, func() bool { return health(t, ctx, op, "ghost") == "unreachable" }) == 0 {
		t.Fatalf("ghost's health is %q, want unreachable (its admin address presents %s's certificate)", health(t, ctx, op, "ghost"), follower)
	}
	// Probed after the ghost was found unreachable: reachable (a probe
	// lost to a loaded machine heals at the next).
	if waitFor(30*time.Second, func() bool { return health(t, ctx, op, follower) == "reachable" }) == 0 {
		t.Fatalf("%s's health is %q with a ghost's record naming its admin address, want reachable", follower, health(t, ctx, op, follower))
	}
}

// A server whose Raft works but whose admin address never answers the
// leader's probes stays a non-voter: nothing shows that it applied the
// log. Here a real node joins with its admin address advertised where
// nothing listens; its heartbeats succeed and it applies the log, and it
// is still not promoted.
func TestUnprobedServerNotPromoted(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 1, hierRules, pki, noTicks)
	_, ln := c.Leader(t)
	ctx := timeout(t, 60*time.Second)
	op := c.LeaderAdmin(t)
	if _, err := op.AllowMember(ctx, &rationv1.AllowMemberRequest{Id: "node1"}); err != nil {
		t.Fatalf("allow node1: %v", err)
	}
	cfg := harness.RaftTestConfig()
	cfg.ID, cfg.Rules, cfg.DataDir = "node1", c.Config(0).Rules, t.TempDir()
	noTicks(&cfg)
	pki.Coordinator(&cfg)
	cfg.Join, cfg.AdminAdvertise = ln.AdminAddr(), deadAddr(t)
	n1, err := coordinator.Start(ctx, cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatalf("node1: %v", err)
	}
	t.Cleanup(func() { n1.Close() })
	if waitFor(30*time.Second, func() bool {
		return health(t, ctx, op, "node1") == "unreachable" && n1.Raft().AppliedIndex() >= ln.Raft().CommitIndex()
	}) == 0 {
		t.Fatalf("node1: health %q, applied %d of %d; want unreachable and caught up", health(t, ctx, op, "node1"), n1.Raft().AppliedIndex(), ln.Raft().CommitIndex())
	}
	if got := configuration(t, ln); got["node1"] != raft.Nonvoter {
		t.Fatalf("configuration %v: node1, never answering a probe, is %v, want a non-voter", got, got["node1"])
	}
}
