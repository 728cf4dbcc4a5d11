package coordinator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"github.com/ration-dev/ration/internal/lease"
)

func mustEncode(t testing.TB, c lease.Command) []byte {
	t.Helper()
	b, err := lease.EncodeCommand(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEntryRoundTrip(t *testing.T) {
	renew := mustEncode(t, lease.Renew{Now: 5, Holder: "a", Seq: 1, Items: []lease.RenewItem{{LeaseID: 1, Quota: "q"}}})
	tick := mustEncode(t, lease.Tick{Now: 6})
	tests := []struct {
		name string
		ops  []op
	}{
		{"one command", []op{commandOp(tick)}},
		{"one member", []op{memberOp(member{ID: "n1", GRPCAddr: "127.0.0.1:1"})}},
		{"member removal", []op{memberOp(member{ID: "n1"})}},
		{"batch", []op{memberOp(member{ID: "n1", GRPCAddr: "h:1"}), commandOp(renew), commandOp(tick)}},
		{"batch with an ignorable type", []op{commandOp(tick), {typ: 0x80 | 0x11, data: []byte("hint")}}},
		{"member with its admin address", append(memberOps(member{ID: "n1", GRPCAddr: "h:1", AdminAddr: "h:3"}), commandOp(tick))},
		{"admin address alone", []op{adminOp(member{ID: "n1", AdminAddr: "h:3"})}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeEntry(encodeEntry(tc.ops))
			if err != nil {
				t.Fatalf("decodeEntry(encodeEntry(%v)) error %v", tc.ops, err)
			}
			if !slices.EqualFunc(got, tc.ops, func(a, b op) bool { return a.typ == b.typ && bytes.Equal(a.data, b.data) }) {
				t.Errorf("decodeEntry(encodeEntry(ops)) = %v, want %v", got, tc.ops)
			}
		})
	}
}

func TestDecodeEntryErrors(t *testing.T) {
	tick := mustEncode(t, lease.Tick{Now: 6})
	sub := appendOp(nil, commandOp(tick))
	batch := func(n uint64, subs ...[]byte) []byte {
		b := []byte{byte(entryBatch), batchVersion}
		b = binary.AppendUvarint(b, n)
		for _, s := range subs {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
		return b
	}
	tests := []struct {
		name    string
		data    []byte
		unknown bool // wants ErrUnknownEntry
	}{
		{"empty", nil, false},
		{"unknown type", []byte{0x7f, 1, 2}, true},
		{"empty command", []byte{byte(entryCommand)}, false},
		{"batch without version", []byte{byte(entryBatch)}, false},
		{"batch of another version", []byte{byte(entryBatch), 9, 1, 1, 1}, false},
		{"batch count 0", batch(0), false},
		{"batch count too high", batch(1000, sub), false},
		{"batch count unreadable", []byte{byte(entryBatch), batchVersion, 0xff}, false},
		{"batch sub-entry past the end", append(batch(1), 50, byte(entryCommand)), false},
		{"batch sub-entry of length 0", append(batch(1), 0, 0), false},
		{"batch in a batch", batch(1, batch(1, sub)), false},
		{"batch trailing bytes", append(batch(1, sub), 0), false},
		{"batch with an unknown type", batch(2, sub, []byte{0x12, 1}), true},
		{"member without version", []byte{byte(entryMember)}, false},
		{"member without id", []byte{byte(entryMember), memberVersion, 0, 0}, false},
		{"member truncated", []byte{byte(entryMember), memberVersion, 5, 'a'}, false},
		{"member trailing bytes", append(appendOp(nil, memberOp(member{ID: "a", GRPCAddr: "b"})), 1), false},
		{"admin of another version", []byte{byte(entryAdmin), 9, 1, 'a', 1, 'b'}, false},
		{"admin without id", []byte{byte(entryAdmin), adminVersion, 0, 0}, false},
		{"admin trailing bytes", append(appendOp(nil, adminOp(member{ID: "a", AdminAddr: "b"})), 1), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeEntry(tc.data)
			if !errors.Is(err, ErrBadEntry) {
				t.Fatalf("decodeEntry(%x) = %v, want ErrBadEntry", tc.data, err)
			}
			if got := errors.Is(err, ErrUnknownEntry); got != tc.unknown {
				t.Errorf("decodeEntry(%x) = %v: ErrUnknownEntry %v, want %v", tc.data, err, got, tc.unknown)
			}
		})
	}
}

// TestAdminEntryIsIgnorable: the admin address is recorded in an entry
// that a node of a version before it skips (the type carries the
// ignorable flag, and is no type an older version knows), so that a group
// can run mixed versions during a rolling upgrade; and memberOps writes it
// only when there is an address to record.
func TestAdminEntryIsIgnorable(t *testing.T) {
	if entryAdmin&ignorableFlag == 0 {
		t.Fatalf("entry type 0x%02x is not ignorable: older nodes would stop on it", byte(entryAdmin))
	}
	for _, known := range []entryType{entryCommand, entryBatch, entryMember} {
		if entryAdmin&^ignorableFlag == known {
			t.Fatalf("entry type 0x%02x is type 0x%02x with the ignorable flag", byte(entryAdmin), byte(known))
		}
	}
	if ops := memberOps(member{ID: "n1", GRPCAddr: "h:1"}); len(ops) != 1 || ops[0].typ != entryMember {
		t.Errorf("memberOps without an admin address = %v, want the member entry alone", ops)
	}
	if ops := memberOps(member{ID: "n1"}); len(ops) != 1 || ops[0].typ != entryMember {
		t.Errorf("memberOps of a removal = %v, want the member entry alone", ops)
	}
	m, err := decodeMember(entryAdmin, adminOp(member{ID: "n1", AdminAddr: "h:3"}).data)
	if err != nil || m != (member{ID: "n1", AdminAddr: "h:3"}) {
		t.Errorf("decodeMember(admin entry) = %+v, %v", m, err)
	}
}

// FuzzDecodeEntry: decoding any bytes never panics, errors always wrap
// ErrBadEntry, and whatever decodes re-encodes to an entry that decodes to
// the same ops (a batch of one re-encodes as the op alone).
func FuzzDecodeEntry(f *testing.F) {
	tick := mustEncode(f, lease.Tick{Now: 6})
	renew := mustEncode(f, lease.Renew{Now: 5, Holder: "a", Seq: 1, Items: []lease.RenewItem{{LeaseID: 1, Quota: "q|s"}}})
	f.Add(encodeEntry([]op{commandOp(tick)}))
	f.Add(encodeEntry([]op{memberOp(member{ID: "n1", GRPCAddr: "127.0.0.1:7001"}), commandOp(mustEncode(f, lease.LeaderElected{Now: 1}))}))
	f.Add(encodeEntry([]op{commandOp(renew), commandOp(tick), {typ: 0x91, data: []byte{1}}}))
	f.Add([]byte{byte(entryBatch), batchVersion, 2, 1, 1})
	f.Add(encodeEntry([]op{allowOp("n2", allowRegister), allowOp("n3", allowWithdraw)}))
	f.Fuzz(func(t *testing.T, data []byte) {
		ops, err := decodeEntry(data)
		if err != nil {
			if !errors.Is(err, ErrBadEntry) {
				t.Fatalf("decodeEntry error %v does not wrap ErrBadEntry", err)
			}
			return
		}
		if len(ops) == 0 {
			t.Fatal("decodeEntry returned no ops and no error")
		}
		again, err := decodeEntry(encodeEntry(ops))
		if err != nil {
			t.Fatalf("re-encoded entry does not decode: %v", err)
		}
		if !slices.EqualFunc(again, ops, func(a, b op) bool { return a.typ == b.typ && bytes.Equal(a.data, b.data) }) {
			t.Fatalf("round trip changed the ops: %v, want %v", again, ops)
		}
		// The FSM's full decoder (lease commands included) must not panic
		// either, and fails only with ErrBadEntry.
		if _, _, err := decodeOps(data); err != nil && !errors.Is(err, ErrBadEntry) {
			t.Fatalf("decodeOps error %v does not wrap ErrBadEntry", err)
		}
	})
}
