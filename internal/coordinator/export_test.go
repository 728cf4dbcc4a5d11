package coordinator

import (
	"context"
	"errors"

	"github.com/hashicorp/raft"

	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

// EntryKinds names the operations of one Raft entry, in order: "member",
// "admin" (a member's admin address), a lease command kind
// ("leader-elected", "renew", ...), or "ignorable".
// Tests that read a node's log on disk use it.
func EntryKinds(data []byte) ([]string, error) {
	ops, cmds, err := decodeOps(data)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ops))
	for i, o := range ops {
		switch o.typ {
		case entryMember:
			out[i] = "member"
		case entryAdmin:
			out[i] = "admin"
		case entryCommand:
			out[i] = cmds[i].Kind().String()
		default:
			out[i] = "ignorable"
		}
	}
	return out, nil
}

// ReadState runs fn on the node's live state (tests only).
func (n *Node) ReadState(fn func(*lease.State)) { n.fsm.read(fn) }

// FmtNum is how the status page writes a number.
var FmtNum = fmtNum

// LeasesVisited is how many leases the node's nudge plans have read in its
// current term (0 when it does not lead): the test hook of the planner's
// cost.
func (n *Node) LeasesVisited() int64 {
	if t := n.term.Load(); t != nil {
		return t.plan.visited.Load()
	}
	return 0
}

// MaxStreamsPerConn bounds the RenewStreams open at once on one connection.
const MaxStreamsPerConn = maxStreamsPerConn

// TLSSource is the node's TLS material (nil in plaintext), for tests of
// its reloads.
func (n *Node) TLSSource() *tlsfiles.Source { return n.tls }

// HandshakeFailures counts the failed TLS handshakes on listener ("-grpc",
// "-admin", "-raft").
func (n *Node) HandshakeFailures(listener string) int64 { return n.handshakeLog(listener).Failures() }

// ProposeCommand commits one lease command through the node's term, as
// its own loops do (stamped with the term's clock); tests only.
func (n *Node) ProposeCommand(ctx context.Context, cmd lease.Command) (OpResult, error) {
	res, err := n.propose(ctx, &proposal{ops: []pendingOp{{cmd: cmd}}})
	if err != nil {
		return OpResult{}, err
	}
	return res[0], nil
}

// PipelinesReplication reports whether n's Raft transport pipelines
// AppendEntries to peer (raftTransportConfig turns it off).
func (n *Node) PipelinesReplication(peerID, peerAddr string) bool {
	p, err := n.trans.AppendEntriesPipeline(raft.ServerID(peerID), raft.ServerAddress(peerAddr))
	if p != nil {
		p.Close()
	}
	return !errors.Is(err, raft.ErrPipelineReplicationNotSupported)
}
