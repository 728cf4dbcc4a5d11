package coordinator

import (
	"encoding/binary"
	"fmt"
)

// Raft entry layout. The first byte of every entry the coordinator proposes
// is its type, so that a node meeting a type it does not know can tell, and
// either skip it (ignorable types) or stop (every other type), never guess.
//
//	command: 0x01 | lease.EncodeCommand bytes (their own type byte and version)
//	batch:   0x02 | version 0x01 | uvarint n | n x (uvarint len | sub-entry)
//	member:  0x03 | version 0x01 | uvarint len | id | uvarint len | grpc address
//	admin:   0x84 | version 0x01 | uvarint len | id | uvarint len | admin address
//	allow:   0x85 | version 0x01 | uvarint len | id | 0x01 (allowed), 0x00 (withdrawn) or 0x02 (seed)
//
// A batch carries command, member and admin sub-entries, never another
// batch, and is applied as a unit: it is decoded in full before any of it
// is applied, so a bad sub-entry stops the node with nothing of the batch
// applied.
//
// The admin entry records a member's admin address (-admin-advertise). It
// is ignorable (0x04 | ignorableFlag): a node of a version before the
// admin listener skips it, so that a group can be upgraded one node at a
// time. The leader writes it right after the member entry of the same
// server, in the same batch; a member entry with an empty address removes
// both addresses.
//
// The allow entry registers (or withdraws) a server id that may add itself
// to the group with its own certificate (security.go). It is ignorable
// too: a node of a version before it skips it and, leading, admits any
// certificate of the group adding itself, as it did; the registration
// changes nothing else Apply computes. A seed registers the id only if no
// registration was ever written before its entry (a bootstrapping node's
// -initial-members: a restart never undoes an operator's removal).
type entryType uint8

const (
	entryCommand entryType = 0x01
	entryBatch   entryType = 0x02
	entryMember  entryType = 0x03
	entryAdmin   entryType = 0x04 | ignorableFlag
	entryAllow   entryType = 0x05 | ignorableFlag

	// ignorableFlag on a type lets a node that does not know the type skip
	// the entry (Nomad's IgnoreUnknownTypeFlag). Only entries that never
	// change what Apply computes for other entries may carry it: metadata,
	// hints. A type without it stops a node that does not know it.
	ignorableFlag entryType = 0x80
)

const (
	batchVersion  = 1
	memberVersion = 1
	adminVersion  = 1
	allowVersion  = 1
	// maxBatchOps bounds a batch's sub-entries so that a corrupt count
	// cannot make the decoder allocate without limit. It is well above
	// what Config.BatchMax allows (each renewal may add ConfigureQuota
	// commands to its batch).
	maxBatchOps = 1 << 20
	// maxMemberField bounds a member's id and address.
	maxMemberField = 1024
)

// op is one decoded sub-entry: its type and its payload (after the type
// byte). For entryCommand the payload is what lease.DecodeCommand reads.
type op struct {
	typ  entryType
	data []byte
}

// member records the lease (gRPC) and admin addresses of a Raft server,
// so any node can send clients, and admin calls, to the leader. An empty
// GRPCAddr removes the server.
type member struct {
	ID, GRPCAddr, AdminAddr string
}

func commandOp(encoded []byte) op { return op{typ: entryCommand, data: encoded} }

// memberOps are the ops recording m: its member entry, then its admin
// entry when it has an admin address (one that joined from a node of an
// older version has none). memberChange is the same as a proposal.
func memberOps(m member) []op {
	ops := []op{memberOp(m)}
	if m.GRPCAddr != "" && m.AdminAddr != "" {
		ops = append(ops, adminOp(m))
	}
	return ops
}

// memberOp is m's member entry: its id and lease address.
func memberOp(m member) op {
	return op{typ: entryMember, data: encodeMember(memberVersion, m.ID, m.GRPCAddr)}
}

// adminOp is m's admin entry: its id and admin address.
func adminOp(m member) op {
	return op{typ: entryAdmin, data: encodeMember(adminVersion, m.ID, m.AdminAddr)}
}

// allowMode is what an allow entry does with its id.
type allowMode byte

const (
	allowWithdraw allowMode = 0
	allowRegister allowMode = 1
	allowSeed     allowMode = 2 // register, if nothing was ever registered
)

// allowOp registers id as a server that may add itself, withdraws its
// registration, or seeds it (mode).
func allowOp(id string, mode allowMode) op {
	b := make([]byte, 0, 2+binary.MaxVarintLen64+len(id))
	b = append(b, allowVersion)
	b = appendString(b, id)
	return op{typ: entryAllow, data: append(b, byte(mode))}
}

// decodeAllow reads an allow entry.
func decodeAllow(b []byte) (string, allowMode, error) {
	if len(b) == 0 || b[0] != allowVersion {
		return "", 0, fmt.Errorf("%w: allow version %v, want %d", ErrBadEntry, firstByte(b), allowVersion)
	}
	id, b, ok := readString(b[1:])
	if !ok || id == "" {
		return "", 0, fmt.Errorf("%w: allow id unreadable", ErrBadEntry)
	}
	if len(b) != 1 || b[0] > byte(allowSeed) {
		return "", 0, fmt.Errorf("%w: allow mode: want one byte 0 to 2, have %d bytes (%v)", ErrBadEntry, len(b), firstByte(b))
	}
	return id, allowMode(b[0]), nil
}

func encodeMember(version byte, id, addr string) []byte {
	b := make([]byte, 0, 1+2*binary.MaxVarintLen64+len(id)+len(addr))
	b = append(b, version)
	b = appendString(b, id)
	return appendString(b, addr)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// encodeEntry writes ops as one Raft entry: the op itself when there is
// one, else a batch.
func encodeEntry(ops []op) []byte {
	if len(ops) == 1 {
		return appendOp(nil, ops[0])
	}
	size := 2 + binary.MaxVarintLen64
	for _, o := range ops {
		size += binary.MaxVarintLen64 + 1 + len(o.data)
	}
	b := make([]byte, 0, size)
	b = append(b, byte(entryBatch), batchVersion)
	b = binary.AppendUvarint(b, uint64(len(ops)))
	for _, o := range ops {
		b = binary.AppendUvarint(b, uint64(1+len(o.data)))
		b = appendOp(b, o)
	}
	return b
}

func appendOp(b []byte, o op) []byte {
	b = append(b, byte(o.typ))
	return append(b, o.data...)
}

// decodeEntry splits a Raft entry into its ops. Types this node does not
// know are returned as they are when flagged ignorable (the caller skips
// them) and are an error otherwise. Every error wraps ErrBadEntry. The
// returned payloads alias b.
func decodeEntry(b []byte) ([]op, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty entry", ErrBadEntry)
	}
	t := entryType(b[0])
	if t != entryBatch {
		o, err := checkOp(t, b[1:])
		if err != nil {
			return nil, err
		}
		return []op{o}, nil
	}
	rest := b[1:]
	if len(rest) == 0 || rest[0] != batchVersion {
		return nil, fmt.Errorf("%w: batch version %v, want %d", ErrBadEntry, firstByte(rest), batchVersion)
	}
	rest = rest[1:]
	n, k := binary.Uvarint(rest)
	if k <= 0 {
		return nil, fmt.Errorf("%w: batch count unreadable", ErrBadEntry)
	}
	rest = rest[k:]
	// Every sub-entry takes at least two bytes (length and type), so a
	// count above half the remaining bytes is corrupt: checking it first
	// bounds the allocation by the entry's own size.
	if n == 0 || n > maxBatchOps || n > uint64(len(rest))/2 {
		return nil, fmt.Errorf("%w: batch count %d for %d bytes", ErrBadEntry, n, len(rest))
	}
	ops := make([]op, 0, n)
	for i := range n {
		size, k := binary.Uvarint(rest)
		if k <= 0 || size == 0 || size > uint64(len(rest)-k) {
			return nil, fmt.Errorf("%w: batch sub-entry %d: length unreadable or past the end", ErrBadEntry, i)
		}
		sub := rest[k : k+int(size)]
		rest = rest[k+int(size):]
		t := entryType(sub[0])
		if t == entryBatch {
			return nil, fmt.Errorf("%w: batch sub-entry %d is a batch", ErrBadEntry, i)
		}
		o, err := checkOp(t, sub[1:])
		if err != nil {
			return nil, fmt.Errorf("batch sub-entry %d: %w", i, err)
		}
		ops = append(ops, o)
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the batch", ErrBadEntry, len(rest))
	}
	return ops, nil
}

// checkOp validates what can be validated without the lease package: the
// type, and a member or admin payload in full (so decodeMember cannot fail
// later).
func checkOp(t entryType, data []byte) (op, error) {
	switch t {
	case entryCommand:
		if len(data) == 0 {
			return op{}, fmt.Errorf("%w: empty command", ErrBadEntry)
		}
	case entryMember, entryAdmin:
		if _, err := decodeMember(t, data); err != nil {
			return op{}, err
		}
	case entryAllow:
		if _, _, err := decodeAllow(data); err != nil {
			return op{}, err
		}
	default:
		if t&ignorableFlag == 0 {
			return op{}, fmt.Errorf("%w 0x%02x", ErrUnknownEntry, byte(t))
		}
	}
	return op{typ: t, data: data}, nil
}

// decodeMember reads a member entry (the address is GRPCAddr) or an admin
// entry (the address is AdminAddr).
func decodeMember(t entryType, b []byte) (member, error) {
	what, version := "member", byte(memberVersion)
	if t == entryAdmin {
		what, version = "admin", adminVersion
	}
	if len(b) == 0 || b[0] != version {
		return member{}, fmt.Errorf("%w: %s version %v, want %d", ErrBadEntry, what, firstByte(b), version)
	}
	b = b[1:]
	id, b, ok := readString(b)
	if !ok || id == "" {
		return member{}, fmt.Errorf("%w: %s id unreadable", ErrBadEntry, what)
	}
	addr, b, ok := readString(b)
	if !ok {
		return member{}, fmt.Errorf("%w: %s address unreadable", ErrBadEntry, what)
	}
	if len(b) != 0 {
		return member{}, fmt.Errorf("%w: %d bytes after the %s", ErrBadEntry, len(b), what)
	}
	if t == entryAdmin {
		return member{ID: id, AdminAddr: addr}, nil
	}
	return member{ID: id, GRPCAddr: addr}, nil
}

func readString(b []byte) (string, []byte, bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > maxMemberField || n > uint64(len(b)-k) {
		return "", nil, false
	}
	return string(b[k : k+int(n)]), b[k+int(n):], true
}

// firstByte describes the first byte of b for an error message.
func firstByte(b []byte) any {
	if len(b) == 0 {
		return "missing"
	}
	return b[0]
}
