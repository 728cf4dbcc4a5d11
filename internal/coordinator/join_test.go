package coordinator_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// heldJoin is a join target in front of a real group: a member's admin
// API (a certificate of the group) that answers Status from the leader
// and holds each AddVoter until the test lets it through to the leader.
type heldJoin struct {
	rationv1.UnimplementedAdminServer
	c       *harness.Coordinators
	t       *testing.T
	asked   chan *rationv1.AddVoterRequest
	release chan struct{}
}

func (h *heldJoin) Status(ctx context.Context, req *rationv1.StatusRequest) (*rationv1.StatusResponse, error) {
	return h.c.LeaderAdmin(h.t).Status(ctx, req)
}

func (h *heldJoin) AddVoter(ctx context.Context, req *rationv1.AddVoterRequest) (*rationv1.MembershipResponse, error) {
	select {
	case h.asked <- req:
	default:
	}
	<-h.release
	return h.c.LeaderAdmin(h.t).AddVoter(ctx, req)
}

// A node joining through -join admits Raft RPCs only from the members its
// join target named before it asked to be added. A certificate of the
// group that is no member ("ghost") wrote a joining node a configuration
// of {ghost, joiner}: the real leader then added the joiner, lost its
// quorum and stepped down, and the group had no leader. Here the ghost's
// AppendEntries (that configuration, a term far ahead) reaches the joiner
// while its join is held, and is refused; the join then completes, and
// the group keeps its leader with the joiner a member.
func TestJoiningNodeAdmitsOnlyTheGroupsMembers(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 3, testRules, pki, noTicks)
	li, _ := c.Leader(t)

	h := &heldJoin{c: c, t: t, asked: make(chan *rationv1.AddVoterRequest, 1), release: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			released = true
			close(h.release)
		}
	}
	t.Cleanup(release)
	target := serveAdmin(t, pki, pki.Member(tlsfiles.GlobalGroup, "node0"), h)

	cfg := harness.RaftTestConfig()
	cfg.ID = "node3"
	cfg.Rules = c.Config(0).Rules
	cfg.DataDir = t.TempDir()
	noTicks(&cfg)
	pki.Coordinator(&cfg)
	cfg.Join = target
	type started struct {
		n   *coordinator.Node
		err error
	}
	done := make(chan started, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	go func() {
		n, err := coordinator.Start(ctx, cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		done <- started{n, err}
	}()
	var req *rationv1.AddVoterRequest
	select {
	case req = <-h.asked:
	case s := <-done:
		t.Fatalf("the joiner started before asking to be added: %v", s.err)
	}

	ghost := harness.RogueRaftClient(t, pki, pki.Member(tlsfiles.GlobalGroup, "ghost"))
	ghostAddr := ghost.LocalAddr()
	conf := raft.Configuration{Servers: []raft.Server{
		{Suffrage: raft.Voter, ID: "ghost", Address: ghostAddr},
		{Suffrage: raft.Voter, ID: "node3", Address: raft.ServerAddress(req.RaftAddress)},
	}}
	hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("ghost"), Addr: []byte(ghostAddr)}
	err := ghost.AppendEntries("node3", raft.ServerAddress(req.RaftAddress), &raft.AppendEntriesRequest{
		RPCHeader: hdr, Term: 1000,
		Entries:           []*raft.Log{{Index: 1, Term: 1000, Type: raft.LogConfiguration, Data: raft.EncodeConfiguration(conf)}},
		LeaderCommitIndex: 1,
	}, &raft.AppendEntriesResponse{})
	if err == nil {
		t.Error("the ghost's AppendEntries to the joining node was answered, want it refused")
	}

	release()
	s := <-done
	if s.err != nil {
		t.Fatalf("join: %v", s.err)
	}
	t.Cleanup(func() { s.n.Close() })
	if waitFor(30*time.Second, func() bool {
		f := s.n.Raft().GetConfiguration()
		if f.Error() != nil {
			return false
		}
		ids := map[raft.ServerID]bool{}
		for _, sv := range f.Configuration().Servers {
			ids[sv.ID] = true
		}
		return len(ids) == 4 && ids["node0"] && ids["node3"] && !ids["ghost"]
	}) == 0 {
		t.Fatalf("the joiner's configuration is %v, want the group's 4 members", s.n.Raft().GetConfiguration().Configuration().Servers)
	}
	if li2, _ := c.Leader(t); li2 != li {
		t.Errorf("node%d leads, was node%d", li2, li)
	}
}
