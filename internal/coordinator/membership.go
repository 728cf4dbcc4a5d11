package coordinator

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ration-dev/ration/internal/tlsfiles"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Membership is what admits a coordinator, not its certificate alone. A
// certificate of the group (ration://coordinator/<group>/<id>) may add
// itself (AddVoter, as -join does) only when its id is in the Raft
// configuration already (a member updating its addresses) or registered
// in the replicated state: by the bootstrapping node's -initial-members,
// by an operator's AllowMember (coordinator members allow) or an
// operator's AddVoter. RemoveServer withdraws the registration, so a
// removed member's certificate, valid until it expires, cannot add it
// back. Without TLS no certificate is checked and every client is
// trusted (security.go).
//
// A server added enters as a non-voter: it receives every entry and
// counts toward no quorum. The leader promotes it to voter once its probe
// of the server's admin address (health.go, which requires that server's
// own certificate) answers with an applied index at least the index at
// which it was added, its heartbeats do not fail, and a heartbeat timeout
// has passed (promoteCaughtUp). A server added at an address nobody
// answers never votes, so it cannot take a group's quorum away (a
// single-node group adding a dead address as a voter had none left at
// once).

// mayAddItself reports whether a coordinator certificate naming id may
// add id to the group: id is in the configuration or registered.
func (n *Node) mayAddItself(id string) bool {
	if n.fsm.isAllowed(id) {
		return true
	}
	return n.inConfiguration(id)
}

// selfAdd reports whether ctx's caller is a coordinator adding itself (a
// coordinator's certificate, not an operator's, under TLS): such a call
// never registers the id, which only an operator does.
func (n *Node) selfAdd(ctx context.Context) bool {
	if n.tls == nil {
		return false
	}
	cert := tlsfiles.PeerCertificate(ctx)
	return cert != nil && !tlsfiles.HasRole(cert, tlsfiles.RoleOperator)
}

// inConfiguration reports whether id is a server of the latest Raft
// configuration this node knows.
func (n *Node) inConfiguration(id string) bool {
	servers, err := n.servers()
	if err != nil {
		return false
	}
	return slices.ContainsFunc(servers, func(s raft.Server) bool { return string(s.ID) == id })
}

// seedMembers registers -initial-members once this node, having
// bootstrapped the group, leads it, unless a registration was ever
// written (a restart of the first node changes nothing an operator did
// since). It returns once they are registered, or with ctx's error or
// ErrStopped.
func (n *Node) seedMembers(ctx context.Context, ids []string) error {
	ids = append(slices.Clone(ids), n.cfg.ID)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if _, written := n.fsm.allowedIDs(); written {
			return nil
		}
		if n.raft.State() == raft.Leader {
			ops := make([]pendingOp, 0, len(ids))
			for _, id := range ids {
				ops = append(ops, pendingOp{allow: &allowChange{id: id, mode: allowSeed}})
			}
			pctx, cancel := context.WithTimeout(ctx, n.cfg.ApplyTimeout)
			_, err := n.propose(pctx, &proposal{ops: ops})
			cancel()
			if err == nil {
				n.logger.Info("registered -initial-members: they may join with their own certificates", "ids", ids)
				return nil
			}
			n.logger.Warn("registering -initial-members failed; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("coordinator: registering -initial-members: %w", ctx.Err())
		case <-n.done:
			return fmt.Errorf("coordinator: registering -initial-members: %w", ErrStopped)
		case <-t.C:
		}
	}
}

// AllowMember registers an id that may add itself to the group.
func (s *adminServer) AllowMember(ctx context.Context, req *rationv1.AllowMemberRequest) (*rationv1.MembershipResponse, error) {
	n := s.n
	if err := n.servable(); err != nil {
		return nil, n.rpcError(ctx, err)
	}
	if err := checkServerID(req.GetId()); err != nil {
		return nil, n.rpcError(ctx, fmt.Errorf("%w: %w", ErrInvalidRequest, err))
	}
	n.memberMu.Lock()
	defer n.memberMu.Unlock()
	if _, err := n.propose(ctx, &proposal{ops: []pendingOp{{allow: &allowChange{id: req.Id, mode: allowRegister}}}}); err != nil {
		return nil, n.rpcError(ctx, err)
	}
	n.logger.Info("server registered: it may join with its own certificate", "server_id", req.Id)
	return s.membership(ctx)
}

// promotion is what a non-voter must show to be promoted: an applied
// index of at least index (the configuration that added it, or the
// commit index when this leader first saw it), and at least a heartbeat
// timeout of heartbeats since added.
type promotion struct {
	index uint64
	since time.Time
}

// addServer adds (or updates) a server as a non-voter, or updates a
// voter's address, and remembers what a new non-voter must show to be
// promoted. n.memberMu held.
func (n *Node) addServer(id, raftAddr string) error {
	f := n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, n.cfg.ApplyTimeout)
	if err := f.Error(); err != nil {
		return err
	}
	h := &n.members
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.promoteAt == nil {
		h.promoteAt = map[string]promotion{}
	}
	h.promoteAt[id] = promotion{index: f.Index(), since: n.clock()}
	return nil
}

// watchHeartbeats records, per peer, whether this node's heartbeats to it
// (as leader) fail: a server whose Raft address does not answer is not
// promoted, whatever its admin address reports.
func (n *Node) watchHeartbeats(obs chan raft.Observation) {
	defer n.wg.Done()
	for {
		select {
		case <-n.done:
			return
		case o := <-obs:
			h := &n.members
			h.mu.Lock()
			if h.hbFailing == nil {
				h.hbFailing = map[string]bool{}
			}
			switch d := o.Data.(type) {
			case raft.FailedHeartbeatObservation:
				h.hbFailing[string(d.PeerID)] = true
			case raft.ResumedHeartbeatObservation:
				delete(h.hbFailing, string(d.PeerID))
			}
			h.mu.Unlock()
		}
	}
}

// promoteCaughtUp promotes, on the leader, every non-voter whose latest
// probe (of its admin address, with its own certificate) answered with an
// applied index at least the one it must reach, whose heartbeats do not
// fail, and that has been a non-voter for a heartbeat timeout at least
// (time for a dead Raft address to fail one). commit is this node's
// commit index before the probes left: a non-voter this leader did not
// add (it took over meanwhile) must reach that. The promotion names the
// configuration it read (prevIndex): a removal or another change since
// makes it fail, never undoes it.
func (n *Node) promoteCaughtUp(commit uint64) {
	h := &n.members
	if n.raft.State() != raft.Leader {
		h.mu.Lock()
		h.promoteAt, h.hbFailing = nil, nil // a later term learns afresh
		h.mu.Unlock()
		return
	}
	n.memberMu.Lock()
	defer n.memberMu.Unlock()
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	now := n.clock()
	var next *raft.Server // one promotion per round: each is a configuration change
	h.mu.Lock()
	if h.promoteAt == nil {
		h.promoteAt = map[string]promotion{}
	}
	nonvoters := map[string]bool{}
	servers := f.Configuration().Servers
	for i, s := range servers {
		id := string(s.ID)
		if s.Suffrage != raft.Nonvoter {
			continue
		}
		nonvoters[id] = true
		at, ok := h.promoteAt[id]
		if !ok {
			h.promoteAt[id] = promotion{index: commit, since: now}
			continue
		}
		p := h.probes[id]
		if p != nil && p.failures == 0 && p.lastErr == "" && !p.lastContact.IsZero() && p.applied >= at.index &&
			!h.hbFailing[id] && now.Sub(at.since) >= n.cfg.HeartbeatTimeout && next == nil {
			next = &servers[i]
		}
	}
	for id := range h.promoteAt {
		if !nonvoters[id] {
			delete(h.promoteAt, id) // promoted, or left the configuration
		}
	}
	h.mu.Unlock()
	if next == nil {
		return
	}
	s := *next
	if err := n.raft.AddVoter(s.ID, s.Address, f.Index(), n.cfg.ApplyTimeout).Error(); err != nil {
		n.logger.Warn("promoting a caught-up non-voter failed; retried at the next probe", "server_id", s.ID, "err", err)
		return
	}
	n.logger.Info("member promoted to voter: it applied the log up to when it was added", "server_id", s.ID, "raft_addr", s.Address)
}
