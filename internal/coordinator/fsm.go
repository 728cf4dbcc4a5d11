package coordinator

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/ration-dev/ration/internal/lease"
)

// FSM is the coordinator's Raft state machine: the lease state of every
// quota (package lease) and the member table, which maps each Raft server
// id to the lease (gRPC) address clients are sent to and the admin address
// admin calls are sent to, and the ids registered to add themselves to the
// group (security.go).
//
// Apply is deterministic: it reads time only from the entries (the leader
// stamps them), never a clock. An entry this node cannot decode, or whose
// type it does not know (and that is not flagged ignorable), STOPS the state
// machine: nothing more is applied, snapshots are refused, and the onStop
// callback shuts the node down. Skipping the entry instead would let this
// replica diverge from the ones that can apply it; stopping makes the
// failure loud and keeps the replicas that remain correct. After an upgrade
// the node replays the same entry and goes on.
//
// Snapshot takes a cheap deep copy under the lock; Persist does the slow
// encoding and writing outside it, so Apply is blocked only for the copy.
type FSM struct {
	logger *slog.Logger
	onStop func(error)

	mu      sync.RWMutex
	state   *lease.State
	members map[string]string // id to lease address
	admins  map[string]string // id to admin address
	// allowed are the ids registered to add themselves; allowWritten
	// whether any registration was ever written (a bootstrapping node
	// seeds -initial-members only into a registry never written).
	allowed      map[string]bool
	allowWritten bool
	applied      uint64 // index of the last entry applied (or restored)
	stopped      error

	restores atomic.Uint64
	// tuneGen changes (under mu) whenever the operators' tunings may have:
	// a Tune command applied, a snapshot restored. tuningOf caches the
	// tunings it read by it, so that a renewal does not wait for the
	// FSM's lock (an entry being applied) to read them.
	tuneGen atomic.Uint64
}

var (
	_ raft.FSM         = (*FSM)(nil)
	_ raft.FSMSnapshot = (*fsmSnapshot)(nil)
)

// NewFSM returns an empty state machine. onStop is called once, from the
// applying goroutine, when an entry cannot be applied; it must not block
// (raft.Shutdown waits for Apply to return, so shut down from a new
// goroutine). A nil onStop only logs.
func NewFSM(logger *slog.Logger, onStop func(error)) *FSM {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if onStop == nil {
		onStop = func(error) {}
	}
	return &FSM{logger: logger, onStop: onStop, state: lease.New(), members: map[string]string{}, admins: map[string]string{}, allowed: map[string]bool{}}
}

// ApplyResult is what Apply returns for an entry: one OpResult per
// command or member change, in entry order.
type ApplyResult struct {
	Ops []OpResult
}

// OpResult is the outcome of one command: lease.State.Apply's answer, or
// nothing for a member change or an ignorable entry.
type OpResult struct {
	Result lease.Result
	Err    error
}

// Apply applies one Raft entry. It returns *ApplyResult, or an error
// wrapping ErrBadEntry or ErrStopped when nothing was applied.
func (f *FSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped != nil {
		return fmt.Errorf("fsm: entry %d: %w", l.Index, ErrStopped)
	}
	if l.Type != raft.LogCommand {
		f.applied = l.Index
		return nil
	}
	ops, cmds, err := decodeOps(l.Data)
	if err != nil {
		f.stop(l.Index, err)
		return err
	}
	res := &ApplyResult{Ops: make([]OpResult, len(ops))}
	written := f.allowWritten // before this entry: its seeds go together
	for i, o := range ops {
		switch o.typ {
		case entryCommand:
			r, err := f.state.Apply(cmds[i])
			if cmds[i].Kind() == lease.KindTune {
				f.tuneGen.Add(1)
			}
			if errors.Is(err, lease.ErrUnknownCommand) {
				// Decoded but not appliable: the same divergence risk as an
				// undecodable entry. Commands before it in a batch were
				// applied; that is fine, the node stops before anything else.
				f.stop(l.Index, err)
				return fmt.Errorf("%w: %w", ErrBadEntry, err)
			}
			res.Ops[i] = OpResult{Result: r, Err: err}
		case entryMember:
			m, _ := decodeMember(o.typ, o.data) // validated by decodeOps
			if m.GRPCAddr == "" {
				delete(f.members, m.ID)
				delete(f.admins, m.ID)
			} else {
				f.members[m.ID] = m.GRPCAddr
			}
		case entryAdmin:
			m, _ := decodeMember(o.typ, o.data)
			if m.AdminAddr == "" {
				delete(f.admins, m.ID)
			} else {
				f.admins[m.ID] = m.AdminAddr
			}
		case entryAllow:
			id, mode, _ := decodeAllow(o.data) // validated by decodeOps
			switch {
			case mode == allowSeed && written:
			case mode == allowWithdraw:
				delete(f.allowed, id)
			default:
				f.allowed[id] = true
			}
			f.allowWritten = true
		default:
			f.logger.Warn("skipping ignorable entry of unknown type",
				"index", l.Index, "type", fmt.Sprintf("0x%02x", byte(o.typ)))
		}
	}
	f.applied = l.Index
	return res
}

// decodeOps decodes a whole entry, commands included, before anything is
// applied, so a bad entry changes nothing.
func decodeOps(data []byte) ([]op, []lease.Command, error) {
	ops, err := decodeEntry(data)
	if err != nil {
		return nil, nil, err
	}
	cmds := make([]lease.Command, len(ops))
	for i, o := range ops {
		if o.typ != entryCommand {
			continue
		}
		c, err := lease.DecodeCommand(o.data)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: command %d: %w", ErrBadEntry, i, err)
		}
		cmds[i] = c
	}
	return ops, cmds, nil
}

func (f *FSM) stop(index uint64, err error) {
	f.stopped = fmt.Errorf("fsm: entry %d: %w", index, err)
	f.logger.Error("state machine stopped: entry cannot be applied; this node stops rather than diverge",
		"index", index, "err", err)
	f.onStop(f.stopped)
}

// Stopped returns why the state machine stopped, or nil.
func (f *FSM) Stopped() error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.stopped
}

// Snapshot copies the state. It is refused once the state machine has
// stopped: a snapshot would record an applied index past the entry that
// stopped it, and a restart would then skip that entry and diverge.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.stopped != nil {
		return nil, fmt.Errorf("fsm: snapshot: %w: %w", ErrStopped, f.stopped)
	}
	return &fsmSnapshot{state: f.state.Clone(), members: maps.Clone(f.members), admins: maps.Clone(f.admins),
		allowed: maps.Clone(f.allowed), allowWritten: f.allowWritten, index: f.applied}, nil
}

// Restore replaces the whole state with a snapshot's.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	snap, err := readSnapshot(bufio.NewReader(rc))
	if err != nil {
		return fmt.Errorf("fsm: restore: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped != nil {
		return fmt.Errorf("fsm: restore: %w", ErrStopped)
	}
	f.state, f.members, f.admins, f.applied = snap.state, snap.members, snap.admins, snap.index
	f.allowed, f.allowWritten = snap.allowed, snap.allowWritten
	f.restores.Add(1)
	f.tuneGen.Add(1)
	f.logger.Info("state restored from snapshot", "index", snap.index)
	return nil
}

// Restores counts snapshots restored since the FSM was created (at start
// from disk, or installed from the leader).
func (f *FSM) Restores() uint64 { return f.restores.Load() }

// State returns a deep copy of the lease state and the index of the last
// entry applied to it.
func (f *FSM) State() (*lease.State, uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.state.Clone(), f.applied
}

// StateBinary returns the encoded lease state and the index it is as of,
// read atomically, so that replicas can be compared byte for byte at the
// same index.
func (f *FSM) StateBinary() ([]byte, uint64, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	b, err := f.state.MarshalBinary()
	return b, f.applied, err
}

// Members returns the member table: Raft server id to lease (gRPC)
// address.
func (f *FSM) Members() map[string]string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return maps.Clone(f.members)
}

// AdminMembers returns the admin addresses of the member table: Raft
// server id to admin address, for the members whose admin address is
// known.
func (f *FSM) AdminMembers() map[string]string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return maps.Clone(f.admins)
}

// allowedIDs returns the ids registered to add themselves, sorted, and
// whether any registration was ever written.
func (f *FSM) allowedIDs() ([]string, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return slices.Sorted(maps.Keys(f.allowed)), f.allowWritten
}

// isAllowed reports whether id is registered to add itself.
func (f *FSM) isAllowed(id string) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.allowed[id]
}

// member returns one server's addresses.
func (f *FSM) member(id string) member {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return member{ID: id, GRPCAddr: f.members[id], AdminAddr: f.admins[id]}
}

// memberTable returns every member's addresses, by id.
func (f *FSM) memberTable() map[string]member {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make(map[string]member, len(f.members))
	for id, a := range f.members {
		out[id] = member{ID: id, GRPCAddr: a, AdminAddr: f.admins[id]}
	}
	return out
}

// read runs fn on the live state under the read lock; fn must not keep
// or change it.
func (f *FSM) read(fn func(*lease.State)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	fn(f.state)
}

// Snapshot layout: a version byte, the applied index, the member table,
// then the lease state's own encoding to the end.
//
//	0x03 | uvarint index | uvarint n | n x (string id, string addr, string admin) | 0x01 | uvarint k | k x string id | state
//	0x02 | uvarint index | uvarint n | n x (string id, string addr, string admin) | state
//	0x01 | uvarint index | uvarint n | n x (string id, string addr) | state
//
// Version 3 adds the ids registered to add themselves (written once any
// registration was). Version 2 adds each member's admin address (empty
// when unknown). Older versions are still read; a node cannot read a
// version newer than its own, which is why a group is upgraded followers
// first (CHANGELOG.md).
const (
	snapshotVersionV3 = 3
	snapshotVersion   = 2
	snapshotVersionV1 = 1
)

type fsmSnapshot struct {
	state   *lease.State
	members map[string]string
	admins  map[string]string
	allowed map[string]bool
	index   uint64

	allowWritten bool
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := s.write(sink); err != nil {
		sink.Cancel()
		return fmt.Errorf("fsm: persist snapshot: %w", err)
	}
	return sink.Close()
}

func (s *fsmSnapshot) write(w io.Writer) error {
	state, err := s.state.MarshalBinary()
	if err != nil {
		return err
	}
	// The lowest version that holds the table (as package lease does for
	// its state): version 1 when no admin address is known.
	v := byte(snapshotVersionV1)
	switch {
	case s.allowWritten:
		v = snapshotVersionV3
	case len(s.admins) > 0:
		v = snapshotVersion
	}
	b := []byte{v}
	b = binary.AppendUvarint(b, s.index)
	b = binary.AppendUvarint(b, uint64(len(s.members)))
	for _, id := range slices.Sorted(maps.Keys(s.members)) {
		b = appendString(b, id)
		b = appendString(b, s.members[id])
		if v >= snapshotVersion {
			b = appendString(b, s.admins[id])
		}
	}
	if v >= snapshotVersionV3 {
		b = append(b, 1)
		b = binary.AppendUvarint(b, uint64(len(s.allowed)))
		for _, id := range slices.Sorted(maps.Keys(s.allowed)) {
			b = appendString(b, id)
		}
	}
	if _, err := w.Write(b); err != nil {
		return err
	}
	_, err = w.Write(state)
	return err
}

func (s *fsmSnapshot) Release() {}

// readSnapshot reads a snapshot of version 3, 2 or 1.
func readSnapshot(r *bufio.Reader) (*fsmSnapshot, error) {
	v, err := r.ReadByte()
	if err != nil || v < snapshotVersionV1 || v > snapshotVersionV3 {
		return nil, fmt.Errorf("%w: snapshot version %v, want %d to %d (%v)", ErrBadEntry, v, snapshotVersionV1, snapshotVersionV3, err)
	}
	index, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, fmt.Errorf("%w: snapshot index: %v", ErrBadEntry, err)
	}
	n, err := binary.ReadUvarint(r)
	if err != nil || n > maxBatchOps {
		return nil, fmt.Errorf("%w: snapshot member count %d: %v", ErrBadEntry, n, err)
	}
	s := &fsmSnapshot{members: make(map[string]string, n), admins: map[string]string{}, allowed: map[string]bool{}, index: index}
	for range n {
		id, err1 := readStringFrom(r)
		addr, err2 := readStringFrom(r)
		var admin string
		var err3 error
		if v >= 2 {
			admin, err3 = readStringFrom(r)
		}
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("%w: snapshot member: %v", ErrBadEntry, err)
		}
		s.members[id] = addr
		if admin != "" {
			s.admins[id] = admin
		}
	}
	if v >= snapshotVersionV3 {
		if err := readAllowed(r, s); err != nil {
			return nil, err
		}
	}
	rest, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	s.state = lease.New()
	if err := s.state.UnmarshalBinary(rest); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadEntry, err)
	}
	return s, nil
}

// readAllowed reads a version 3 snapshot's registered ids.
func readAllowed(r *bufio.Reader, s *fsmSnapshot) error {
	if flag, err := r.ReadByte(); err != nil || flag != 1 {
		return fmt.Errorf("%w: snapshot registry flag %v, want 1 (%v)", ErrBadEntry, flag, err)
	}
	k, err := binary.ReadUvarint(r)
	if err != nil || k > maxBatchOps {
		return fmt.Errorf("%w: snapshot registry count %d: %v", ErrBadEntry, k, err)
	}
	s.allowWritten = true
	for range k {
		id, err := readStringFrom(r)
		if err != nil || id == "" {
			return fmt.Errorf("%w: snapshot registered id %q: %v", ErrBadEntry, id, err)
		}
		s.allowed[id] = true
	}
	return nil
}

func readStringFrom(r *bufio.Reader) (string, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return "", err
	}
	if n > maxMemberField {
		return "", fmt.Errorf("string of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return string(b), nil
}
