package coordinator

import (
	"bufio"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"

	"github.com/ration-dev/ration/internal/tlsfiles"
)

// Who may speak Raft to this node (docs/security.md). A certificate of the
// CA is not enough, nor is a coordinator's: every group of the fleet has
// coordinators, under one CA, and with the same pod names. A peer is
// admitted when
//
//   - its certificate names a member of this node's group
//     (ration://coordinator/<group>/<id>), checked at the handshake;
//   - every RPC it sends carries, in its header, a server id its
//     certificate names (a member cannot speak for another), and that id
//     is in this node's current Raft configuration. A node whose
//     configuration is still empty and that joins through -join admits
//     only the members its join target named (pin), at their addresses,
//     before it asks to be added: the leader adding it is one of them. A
//     certificate of the group that is no member cannot write the joining
//     node a configuration of its own. A node started with neither -join
//     nor Raft state (an operator adds it with members add) admits any
//     member of its group until its configuration holds it
//     (docs/security.md, Not covered yet).
//
// When it dials, a node checks that the certificate of the server at that
// address names the member the configuration has there.

// ErrRaftPeer marks a Raft connection or RPC refused for the peer's
// identity.
var ErrRaftPeer = errors.New("raft peer refused")

// raftPeers holds what the Raft transport checks peers against: the
// group's name and, once Raft is up, its configuration.
type raftPeers struct {
	group  string
	logger *slog.Logger
	raft   atomic.Pointer[raft.Raft]
	// refused counts refused RPCs
	// (ration_coordinator_raft_rpcs_refused_total).
	refused atomic.Int64
	// joining: started with -join and no Raft state; pinned: the members
	// (id to Raft address) its join target named, nil until it answered.
	joining atomic.Bool
	pinned  atomic.Pointer[map[string]string]
}

// pin records the members a joining node admits until its configuration
// holds it.
func (p *raftPeers) pin(servers map[string]string) {
	p.pinned.Store(&servers)
}

// checkJoining is checkRPC's check while the configuration is empty.
func (p *raftPeers) checkJoining(id string, hdr raft.RPCHeader) error {
	if !p.joining.Load() {
		return nil // added by an operator: see the comment at the top
	}
	pin := p.pinned.Load()
	if pin == nil {
		return fmt.Errorf("%w: server %q: this node is joining and its join target has not named the group's members yet", ErrRaftPeer, id)
	}
	addr, ok := (*pin)[id]
	if !ok {
		return fmt.Errorf("%w: server %q (certificate %s) is not among the members the join target named for group %q",
			ErrRaftPeer, id, tlsfiles.CoordinatorURI(p.group, id), p.group)
	}
	if len(hdr.Addr) > 0 && string(hdr.Addr) != addr {
		return fmt.Errorf("%w: server %q sent address %q, and the join target has it at %q", ErrRaftPeer, id, hdr.Addr, addr)
	}
	return nil
}

// servers returns the latest Raft configuration's servers (raft keeps a
// copy readable outside its main loop: no call blocks on it), and whether
// Raft is up.
func (p *raftPeers) servers() ([]raft.Server, bool) {
	r := p.raft.Load()
	if r == nil {
		return nil, false
	}
	f := r.GetConfiguration()
	if f.Error() != nil {
		return nil, true
	}
	return f.Configuration().Servers, true
}

// checkRPC decides whether an RPC with header hdr, received over a
// connection whose certificate is peer, may reach Raft.
func (p *raftPeers) checkRPC(peer *x509.Certificate, hdr raft.RPCHeader) error {
	id := string(hdr.ID)
	ids := tlsfiles.MemberIDs(peer, p.group)
	if !slices.Contains(ids, id) {
		return fmt.Errorf("%w: an RPC from server id %q over a connection whose certificate names members %q of group %q",
			ErrRaftPeer, id, ids, p.group)
	}
	servers, up := p.servers()
	if !up {
		return fmt.Errorf("%w: Raft is not running yet", ErrRaftPeer)
	}
	if len(servers) == 0 {
		// Joining: the leader adding this node is about to call.
		return p.checkJoining(id, hdr)
	}
	for _, s := range servers {
		if string(s.ID) != id {
			continue
		}
		if len(hdr.Addr) > 0 && string(hdr.Addr) != string(s.Address) {
			return fmt.Errorf("%w: server %q sent address %q, and the configuration has it at %q",
				ErrRaftPeer, id, hdr.Addr, s.Address)
		}
		return nil
	}
	return fmt.Errorf("%w: server %q (certificate %s) is not in group %q's Raft configuration",
		ErrRaftPeer, id, tlsfiles.CoordinatorURI(p.group, id), p.group)
}

// dialAuthorize is the check of the server this node dials at address:
// the member the configuration has there, or, for an address it does not
// hold, a member of the group that is in the configuration.
func (p *raftPeers) dialAuthorize(address raft.ServerAddress) tlsfiles.Authorize {
	servers, _ := p.servers()
	for _, s := range servers {
		if s.Address == address {
			return tlsfiles.RequireMember(p.group, string(s.ID))
		}
	}
	return func(leaf *x509.Certificate) error {
		ids := tlsfiles.MemberIDs(leaf, p.group)
		for _, s := range servers {
			if slices.Contains(ids, string(s.ID)) {
				return nil
			}
		}
		return fmt.Errorf("%w: the server at %s names members %q of group %q, none in its Raft configuration",
			ErrRaftPeer, address, ids, p.group)
	}
}

// rpcInstallSnapshot is hashicorp/raft's wire type of InstallSnapshot,
// whose request is followed by the snapshot's bytes.
const rpcInstallSnapshot = 2

// rpcGuard is an accepted Raft connection that reads each RPC ahead of
// the transport and hands it on only when raftPeers admits its header:
// the transport (hashicorp/raft's NetworkTransport) decodes RPCs itself
// and tells Raft nothing of the connection they came over. The wire is one
// type byte, the msgpack request, and for InstallSnapshot the snapshot's
// bytes.
type rpcGuard struct {
	*handshakeConn
	peers *raftPeers

	br   *bufio.Reader
	dec  *codec.Decoder
	peer *x509.Certificate
	buf  []byte // a checked RPC the transport has not read yet
	raw  int64  // snapshot bytes still to pass on unread
	err  error
}

// guardBuffer is the read buffer: a few heartbeats, or part of a batch.
const guardBuffer = 64 << 10

func (g *rpcGuard) Read(b []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if len(g.buf) == 0 && g.raw == 0 {
		if err := g.next(); err != nil {
			g.err = err
			if errors.Is(err, ErrRaftPeer) {
				g.peers.refused.Add(1)
				g.peers.logger.Warn("Raft RPC refused; connection closed", "peer", g.subject(), "err", err)
			}
			g.handshakeConn.Close()
			return 0, err
		}
	}
	if len(g.buf) > 0 {
		n := copy(b, g.buf)
		g.buf = g.buf[n:]
		return n, nil
	}
	if int64(len(b)) > g.raw {
		b = b[:g.raw]
	}
	n, err := g.br.Read(b)
	g.raw -= int64(n)
	return n, err
}

func (g *rpcGuard) subject() string {
	if g.peer == nil {
		return ""
	}
	return g.peer.Subject.String()
}

// next reads one RPC request, checks its header and keeps it for Read.
func (g *rpcGuard) next() error {
	if g.br == nil {
		if err := g.handshake(); err != nil {
			return err
		}
		certs := g.ConnectionState().PeerCertificates
		if len(certs) == 0 {
			return fmt.Errorf("%w: no certificate", ErrRaftPeer)
		}
		g.peer = certs[0]
		g.br = bufio.NewReaderSize(g.handshakeConn.Conn, guardBuffer)
		g.dec = codec.NewDecoder(g.br, &codec.MsgpackHandle{})
	}
	t, err := g.br.ReadByte()
	if err != nil {
		return err
	}
	var raw codec.Raw
	if err := g.dec.Decode(&raw); err != nil {
		return fmt.Errorf("raft RPC of type %d: %w", t, err)
	}
	// Every request embeds raft.RPCHeader (encoded inline); Size is
	// InstallSnapshot's length of the data that follows.
	var req struct {
		raft.RPCHeader
		Size int64
	}
	if err := codec.NewDecoderBytes(raw, &codec.MsgpackHandle{}).Decode(&req); err != nil {
		return fmt.Errorf("raft RPC of type %d: header: %w", t, err)
	}
	if err := g.peers.checkRPC(g.peer, req.RPCHeader); err != nil {
		return err
	}
	if t == rpcInstallSnapshot {
		if req.Size < 0 {
			return fmt.Errorf("raft InstallSnapshot: size %d", req.Size)
		}
		g.raw = req.Size
	}
	g.buf = make([]byte, 0, 1+len(raw))
	g.buf = append(append(g.buf, t), raw...)
	return nil
}
