package coordinator

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/hashicorp/raft"

	"github.com/ration-dev/ration/internal/buildinfo"
	"github.com/ration-dev/ration/internal/lease"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// adminServer serves ration.v1.Admin. Status, ListQuotas and ListLeases
// answer from this node's own state (on a follower it may lag the leader
// by the entries not yet applied); membership changes need the leader.
type adminServer struct {
	rationv1.UnimplementedAdminServer
	n *Node
}

func (s *adminServer) Status(ctx context.Context, _ *rationv1.StatusRequest) (*rationv1.StatusResponse, error) {
	n := s.n
	stats := n.raft.Stats()
	u := func(k string) uint64 { v, _ := strconv.ParseUint(stats[k], 10, 64); return v }
	id, addr, admin := n.leader()
	resp := &rationv1.StatusResponse{
		Id:                 n.cfg.ID,
		State:              n.raft.State().String(),
		LeaderId:           id,
		LeaderAddress:      addr,
		LeaderAdminAddress: admin,
		Term:               u("term"),
		CommitIndex:        u("commit_index"),
		AppliedIndex:       u("applied_index"),
		LastSnapshotIndex:  u("last_snapshot_index"),
		Version:            buildinfo.Get().Version,
		Commit:             shortCommit(buildinfo.Get().Commit),
		UptimeSeconds:      n.uptime().Seconds(),
	}
	if servers, err := n.servers(); err == nil {
		resp.Servers = n.raftServers(servers)
	}
	return resp, nil
}

func (s *adminServer) ListQuotas(ctx context.Context, _ *rationv1.ListQuotasRequest) (*rationv1.ListQuotasResponse, error) {
	resp := &rationv1.ListQuotasResponse{}
	s.n.fsm.read(func(st *lease.State) {
		for _, name := range st.Quotas() {
			q, _ := st.Quota(name)
			resp.Quotas = append(resp.Quotas, &rationv1.QuotaStatus{
				Quota: name, Burst: q.Effective().Burst, Rate: q.Effective().Rate, Pool: q.Pool,
				LeasedCap: q.ReservedCap, LeasedRate: q.ReservedRate, Leases: uint32(q.Leases),
			})
		}
	})
	return resp, nil
}

func (s *adminServer) ListLeases(ctx context.Context, req *rationv1.ListLeasesRequest) (*rationv1.ListLeasesResponse, error) {
	resp := &rationv1.ListLeasesResponse{}
	s.n.fsm.read(func(st *lease.State) {
		quotas := st.Quotas()
		if req.GetQuota() != "" {
			quotas = []string{req.GetQuota()}
		}
		for _, q := range quotas {
			for _, l := range st.Leases(q) {
				resp.Leases = append(resp.Leases, &rationv1.LeaseStatus{
					LeaseId: l.ID, Quota: l.Quota, Holder: l.Holder,
					Cap: l.Cap, Rate: l.Rate, Demand: l.Demand,
					ExpiryUnixUs: l.Expiry, ReclaimUnixUs: l.ReclaimAt,
				})
			}
		}
	})
	return resp, nil
}

// AddVoter records the new server's lease and admin addresses in the
// member table first (and, for an operator's call, its id as registered:
// membership.go), then adds it to the Raft configuration as a non-voter,
// promoted once caught up, so that the moment it can lead, every node can
// send clients (and admin calls) to it. Adding a server that is already a
// member at the same address is a no-op, so a joining node may retry; a
// voter stays a voter. The admin address is required: the leader promotes
// a server once its probe there finds it caught up.
func (s *adminServer) AddVoter(ctx context.Context, req *rationv1.AddVoterRequest) (*rationv1.MembershipResponse, error) {
	n := s.n
	if err := n.servable(); err != nil {
		return nil, n.rpcError(ctx, err)
	}
	if err := checkMember(req.GetId(), req.GetRaftAddress(), req.GetGrpcAddress(), req.GetAdminAddress()); err != nil {
		return nil, n.rpcError(ctx, err)
	}
	if req.GetAdminAddress() == "" {
		return nil, n.rpcError(ctx, fmt.Errorf("%w: admin_address is empty: a server is promoted to voter once the leader's probe of its admin address finds it caught up (a node of a version before admin addresses cannot join this group: upgrade it)", ErrInvalidRequest))
	}
	// One membership change at a time on this leader, and a certificate
	// adding itself checked again under it: a removal in progress
	// withdraws the registration before the server leaves the
	// configuration, and a call admitted before that must not add the
	// server back after it.
	n.memberMu.Lock()
	defer n.memberMu.Unlock()
	self := n.selfAdd(ctx)
	if self && !n.mayAddItself(req.Id) {
		return nil, n.rpcError(ctx, fmt.Errorf("%w: server %q is neither a member nor registered to join (any more)", ErrPermissionDenied, req.Id))
	}
	m := member{ID: req.Id, GRPCAddr: req.GrpcAddress, AdminAddr: req.AdminAddress}
	ops := memberChange(m)
	if !self {
		ops = append(ops, pendingOp{allow: &allowChange{id: req.Id, mode: allowRegister}})
	}
	if _, err := n.propose(ctx, &proposal{ops: ops}); err != nil {
		return nil, n.rpcError(ctx, err)
	}
	if err := n.addServer(req.Id, req.RaftAddress); err != nil {
		return nil, n.rpcError(ctx, fmt.Errorf("%w: add voter %s: %w", ErrNotLeader, req.Id, err))
	}
	n.logger.Info("server added: a voter once it has caught up", "server_id", req.Id, "raft_addr", req.RaftAddress, "grpc_addr", req.GrpcAddress, "admin_addr", req.AdminAddress)
	return s.membership(ctx)
}

// RemoveServer takes a server out of the Raft configuration, then out of
// the member table. Removing the leader itself removes its member record
// first: once removed it can no longer commit anything.
func (s *adminServer) RemoveServer(ctx context.Context, req *rationv1.RemoveServerRequest) (*rationv1.MembershipResponse, error) {
	n := s.n
	if err := n.servable(); err != nil {
		return nil, n.rpcError(ctx, err)
	}
	if req.GetId() == "" {
		return nil, n.rpcError(ctx, fmt.Errorf("%w: id is empty", ErrInvalidRequest))
	}
	n.memberMu.Lock()
	defer n.memberMu.Unlock()
	servers, err := n.servers()
	if err != nil {
		return nil, n.rpcError(ctx, err)
	}
	known := false
	for _, sv := range servers {
		known = known || string(sv.ID) == req.Id
	}
	withdraw := pendingOp{allow: &allowChange{id: req.Id, mode: allowWithdraw}}
	if !known && n.fsm.isAllowed(req.Id) {
		// Registered, never joined: withdrawing the registration is the
		// whole removal.
		if _, err := n.propose(ctx, &proposal{ops: []pendingOp{withdraw}}); err != nil {
			return nil, n.rpcError(ctx, err)
		}
		n.logger.Info("server registration withdrawn", "server_id", req.Id)
		return s.membership(ctx)
	}
	if !known {
		return nil, n.rpcError(ctx, fmt.Errorf("%w: no server %q in the configuration, nor registered", ErrInvalidRequest, req.Id))
	}
	// The registration is withdrawn before the server leaves the
	// configuration: from then on its certificate cannot add it back.
	if _, err := n.propose(ctx, &proposal{ops: []pendingOp{withdraw}}); err != nil {
		return nil, n.rpcError(ctx, err)
	}
	forget := func() error {
		_, err := n.propose(ctx, &proposal{ops: []pendingOp{{member: &member{ID: req.Id}}}})
		return err
	}
	self := req.Id == n.cfg.ID
	if self {
		if err := forget(); err != nil {
			return nil, n.rpcError(ctx, err)
		}
	}
	if err := n.raft.RemoveServer(raft.ServerID(req.Id), 0, n.cfg.ApplyTimeout).Error(); err != nil {
		return nil, n.rpcError(ctx, fmt.Errorf("%w: remove server %s: %w", ErrNotLeader, req.Id, err))
	}
	if !self {
		if err := forget(); err != nil {
			n.logger.Warn("server removed, but its member record stays until the next change", "server_id", req.Id, "err", err)
		}
	}
	n.logger.Info("server removed", "server_id", req.Id)
	if self {
		return &rationv1.MembershipResponse{}, nil
	}
	return s.membership(ctx)
}

func (s *adminServer) membership(ctx context.Context) (*rationv1.MembershipResponse, error) {
	servers, err := s.n.servers()
	if err != nil {
		return nil, s.n.rpcError(ctx, err)
	}
	allowed, _ := s.n.fsm.allowedIDs()
	return &rationv1.MembershipResponse{Servers: s.n.raftServers(servers), Allowed: allowed}, nil
}

// raftServers are the Raft configuration's servers with their lease and
// admin addresses from the member table, and their health as this node
// sees it (health.go).
func (n *Node) raftServers(servers []raft.Server) []*rationv1.RaftServer {
	members := n.fsm.memberTable()
	health := n.memberStatuses(servers)
	out := make([]*rationv1.RaftServer, len(servers))
	for i, sv := range servers {
		m, h := members[string(sv.ID)], health[i]
		rs := &rationv1.RaftServer{Id: string(sv.ID), Address: string(sv.Address), Suffrage: sv.Suffrage.String(),
			GrpcAddress: m.GRPCAddr, AdminAddress: m.AdminAddr,
			Health: h.Health, ProbeError: h.Error, AppliedIndex: h.Applied, Lag: h.Lag,
			Version: h.Version, Commit: h.Commit, UptimeSeconds: h.Uptime.Seconds()}
		if !h.LastContact.IsZero() {
			rs.LastContactUnixUs = h.LastContact.UnixMicro()
		}
		out[i] = rs
	}
	return out
}

// maxServerID bounds a server id (AddVoter, AllowMember,
// -initial-members).
const maxServerID = 255

// checkServerID refuses an empty or overlong server id.
func checkServerID(id string) error {
	if id == "" || len(id) > maxServerID {
		return fmt.Errorf("id %.40q: 1 to %d bytes", id, maxServerID)
	}
	return nil
}

func checkMember(id, raftAddr, grpcAddr, adminAddr string) error {
	var errs []error
	if err := checkServerID(id); err != nil {
		errs = append(errs, err)
	}
	addrs := []struct{ name, v string }{{"raft_address", raftAddr}, {"grpc_address", grpcAddr}}
	if adminAddr != "" {
		addrs = append(addrs, struct{ name, v string }{"admin_address", adminAddr})
	}
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a.v)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s %q: %v", a.name, a.v, err))
		case host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified():
			errs = append(errs, fmt.Errorf("%s %q: not dialable", a.name, a.v))
		case len(a.v) > maxMemberField:
			errs = append(errs, fmt.Errorf("%s: too long", a.name))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %v", ErrInvalidRequest, joinErrs(errs))
}

func joinErrs(errs []error) string {
	s := ""
	for i, e := range errs {
		if i > 0 {
			s += "; "
		}
		s += e.Error()
	}
	return s
}
