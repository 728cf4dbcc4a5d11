package coordinator

import (
	"errors"
	"fmt"

	"github.com/ration-dev/ration/internal/coordclient"
)

// Sentinel errors callers branch on. They are mapped to gRPC codes only at
// the edge (grpc.go): ErrNotLeader and ErrNotReady to UNAVAILABLE with the
// leader's address in the "ration-leader" trailer.
var (
	// ErrNotLeader: this node is not the Raft leader, so it can neither
	// commit nor answer with authority. Retry at the leader.
	ErrNotLeader = errors.New("not the leader")
	// ErrNotReady: this node is the leader but has not yet applied its
	// LeaderElected entry (and everything committed before it), so it does
	// not yet know every live lease. Retry shortly.
	ErrNotReady = errors.New("leader not ready")
	// ErrStopped: the node was shut down, or its state machine stopped on an
	// entry it could not apply. A closed Client answers it too (it is
	// coordclient.ErrStopped).
	ErrStopped = coordclient.ErrStopped
	// ErrInvalidRequest marks a request rejected before anything was
	// proposed: no state changed. It is coordclient.ErrInvalidRequest.
	ErrInvalidRequest = coordclient.ErrInvalidRequest
	// ErrSeqAhead marks a holder request whose seq is too far ahead of the
	// coordinator's clock (checkSeqAhead): nothing was proposed. gRPC
	// OUT_OF_RANGE, apart from INVALID_ARGUMENT, which holders read as a
	// request too large and split.
	ErrSeqAhead = errors.New("sequence number ahead of the coordinator's clock")
	// ErrBadEntry marks a Raft log entry or snapshot this node cannot decode.
	// Applying it is impossible and skipping it would diverge from the
	// nodes that can, so the state machine stops (see FSM).
	ErrBadEntry = errors.New("undecodable entry")
	// ErrUnknownEntry marks an entry type this version does not know and
	// that is not flagged as ignorable. It wraps ErrBadEntry.
	ErrUnknownEntry = fmt.Errorf("%w: unknown entry type", ErrBadEntry)
	// ErrInvalidConfig marks a Config that failed Validate.
	ErrInvalidConfig = errors.New("invalid coordinator config")
)
