package coordinator

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"maps"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/ration-dev/ration/internal/lease"
)

func entryLog(index uint64, ops ...op) *raft.Log {
	return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: encodeEntry(ops)}
}

func configureOp(t testing.TB, now int64) op {
	return commandOp(mustEncode(t, lease.ConfigureQuota{Now: now, Quota: "hot|", Burst: 100, Rate: 10, LeasePeriod: 2e6}))
}

func newTestFSM(t *testing.T) (*FSM, *[]error) {
	t.Helper()
	var stops []error
	f := NewFSM(slog.New(slog.DiscardHandler), func(err error) { stops = append(stops, err) })
	if r, ok := f.Apply(entryLog(1, configureOp(t, 1))).(*ApplyResult); !ok || r.Ops[0].Err != nil {
		t.Fatalf("configure: %v", r)
	}
	return f, &stops
}

func stateBytes(t *testing.T, f *FSM) []byte {
	t.Helper()
	b, _, err := f.StateBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFSMStopsOnBadEntry: an entry this node cannot decode stops the
// state machine: nothing of it is applied, nothing after it either, no
// snapshot is taken, and onStop is called once.
func TestFSMStopsOnBadEntry(t *testing.T) {
	grant := mustEncode(t, lease.Grant{Now: 2, Holder: "a", Seq: 1, Quota: "hot|", Demand: 1})
	unknownKind := append([]byte{99, 1}, grant[2:]...)
	unknownVersion := append([]byte{grant[0], 9}, grant[2:]...)
	tests := []struct {
		name string
		log  *raft.Log
	}{
		{"unknown entry type", &raft.Log{Index: 2, Type: raft.LogCommand, Data: []byte{0x7f, 1, 2, 3}}},
		{"unknown entry type in a batch", &raft.Log{Index: 2, Type: raft.LogCommand,
			Data: encodeEntry([]op{commandOp(grant), {typ: 0x21, data: []byte{1}}})}},
		{"unknown lease command kind", entryLog(2, commandOp(unknownKind))},
		{"unknown lease command version", entryLog(2, commandOp(unknownVersion))},
		{"unknown lease command after a good one", entryLog(2, commandOp(grant), commandOp(unknownKind))},
		{"corrupt lease command", entryLog(2, commandOp([]byte{grant[0], grant[1], '{'}))},
		{"empty entry", &raft.Log{Index: 2, Type: raft.LogCommand}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, stops := newTestFSM(t)
			before := stateBytes(t, f)
			res := f.Apply(tc.log)
			err, ok := res.(error)
			if !ok || !errors.Is(err, ErrBadEntry) {
				t.Fatalf("Apply(%s) = %v, want an error wrapping ErrBadEntry", tc.name, res)
			}
			if len(*stops) != 1 || f.Stopped() == nil {
				t.Fatalf("onStop called %d times, Stopped() = %v; want once, non-nil", len(*stops), f.Stopped())
			}
			if after := stateBytes(t, f); !bytes.Equal(after, before) {
				t.Errorf("the bad entry changed the state:\n%s\nwant\n%s", after, before)
			}
			// Nothing after it is applied.
			res = f.Apply(entryLog(3, commandOp(grant)))
			if err, ok := res.(error); !ok || !errors.Is(err, ErrStopped) {
				t.Errorf("Apply after the stop = %v, want ErrStopped", res)
			}
			if after := stateBytes(t, f); !bytes.Equal(after, before) {
				t.Error("an entry after the stop was applied")
			}
			if _, err := f.Snapshot(); !errors.Is(err, ErrStopped) {
				t.Errorf("Snapshot after the stop = %v, want ErrStopped", err)
			}
			if len(*stops) != 1 {
				t.Errorf("onStop called %d times, want once", len(*stops))
			}
		})
	}
}

// TestFSMSkipsIgnorableEntry: a type this node does not know but that
// carries the ignorable flag is skipped; the rest of its batch applies.
func TestFSMSkipsIgnorableEntry(t *testing.T) {
	f, stops := newTestFSM(t)
	grant := mustEncode(t, lease.Grant{Now: 2, Holder: "a", Seq: 1, Quota: "hot|", Demand: 1})
	res, ok := f.Apply(entryLog(2, op{typ: ignorableFlag | 0x33, data: []byte("future hint")}, commandOp(grant))).(*ApplyResult)
	if !ok {
		t.Fatalf("Apply = %v, want *ApplyResult", res)
	}
	if len(*stops) != 0 || f.Stopped() != nil {
		t.Fatalf("an ignorable entry stopped the FSM: %v", f.Stopped())
	}
	if r := res.Ops[1]; r.Err != nil || r.Result.Lease == nil {
		t.Errorf("grant after the ignorable entry: %+v, want a lease", r)
	}
}

// TestFSMBatchResults: one entry, several commands and a member change;
// each gets its own answer, in order, and the member table follows.
func TestFSMBatchResults(t *testing.T) {
	f := NewFSM(nil, nil)
	res, ok := f.Apply(entryLog(7,
		memberOp(member{ID: "n1", GRPCAddr: "127.0.0.1:9"}),
		configureOp(t, 1),
		commandOp(mustEncode(t, lease.Grant{Now: 1, Holder: "a", Seq: 1, Quota: "hot|", Demand: 4})),
		commandOp(mustEncode(t, lease.Grant{Now: 1, Holder: "b", Seq: 1, Quota: "nope|", Demand: 4})),
		commandOp(mustEncode(t, lease.Grant{Now: 1, Holder: "a", Seq: 1, Quota: "hot|", Demand: 4})),
	)).(*ApplyResult)
	if !ok || len(res.Ops) != 5 {
		t.Fatalf("Apply = %v, want 5 results", res)
	}
	if r := res.Ops[2]; r.Err != nil || r.Result.Lease == nil || r.Result.Lease.ID == 0 {
		t.Errorf("grant: %+v, want a lease", r)
	}
	if r := res.Ops[3]; !errors.Is(r.Err, lease.ErrUnknownQuota) {
		t.Errorf("grant on an unknown quota: %v, want ErrUnknownQuota", r.Err)
	}
	if r := res.Ops[4]; r.Err != nil || !r.Result.Replayed || r.Result.Lease.ID != res.Ops[2].Result.Lease.ID {
		t.Errorf("repeated grant: %+v, want the first answer replayed", r)
	}
	if got := f.Members(); !maps.Equal(got, map[string]string{"n1": "127.0.0.1:9"}) {
		t.Errorf("members = %v", got)
	}
	f.Apply(entryLog(8, memberOp(member{ID: "n1"})))
	if got := f.Members(); len(got) != 0 {
		t.Errorf("members after removal = %v, want none", got)
	}
	if _, idx := f.State(); idx != 8 {
		t.Errorf("applied index %d, want 8", idx)
	}
}

// TestFSMAdminAddresses: the member table keeps each member's admin
// address from its admin entry; a member entry alone (a leader of an older
// version) keeps the admin address known; removing the member removes
// both.
func TestFSMAdminAddresses(t *testing.T) {
	f := NewFSM(nil, nil)
	f.Apply(entryLog(1, memberOps(member{ID: "n1", GRPCAddr: "h:1", AdminAddr: "h:3"})...))
	f.Apply(entryLog(2, memberOp(member{ID: "n2", GRPCAddr: "h:11"})))
	if got, want := f.memberTable(), map[string]member{"n1": {"n1", "h:1", "h:3"}, "n2": {"n2", "h:11", ""}}; !maps.Equal(got, want) {
		t.Errorf("member table %v, want %v", got, want)
	}
	f.Apply(entryLog(3, memberOp(member{ID: "n1", GRPCAddr: "h:2"})))
	if got := f.member("n1"); got != (member{"n1", "h:2", "h:3"}) {
		t.Errorf("n1 after a member entry alone: %+v, want its admin address kept", got)
	}
	f.Apply(entryLog(4, memberOp(member{ID: "n1"})))
	if got := f.member("n1"); got != (member{ID: "n1"}) || len(f.AdminMembers()) != 0 {
		t.Errorf("n1 after removal: %+v (admin table %v), want nothing", got, f.AdminMembers())
	}
}

// TestFSMSnapshotVersions: a snapshot of a member table with admin
// addresses is version 2 and restores them; one without is written as
// version 1, which nodes of older versions read; and a version 1 snapshot
// written by them (the old layout, built here by hand) restores, with no
// admin addresses.
func TestFSMSnapshotVersions(t *testing.T) {
	persist := func(f *FSM) []byte {
		t.Helper()
		snap, err := f.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := snap.(*fsmSnapshot).write(&b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	restore := func(b []byte) *FSM {
		t.Helper()
		g := NewFSM(nil, nil)
		if err := g.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
			t.Fatalf("Restore(version %d): %v", b[0], err)
		}
		return g
	}
	f := NewFSM(nil, nil)
	f.Apply(entryLog(1, memberOps(member{ID: "n1", GRPCAddr: "h:1", AdminAddr: "h:3"})...))
	f.Apply(entryLog(2, memberOp(member{ID: "n2", GRPCAddr: "h:11"})))
	b := persist(f)
	if b[0] != 2 {
		t.Errorf("snapshot with admin addresses: version %d, want 2", b[0])
	}
	if g := restore(b); !maps.Equal(g.memberTable(), f.memberTable()) {
		t.Errorf("restored member table %v, want %v", g.memberTable(), f.memberTable())
	}

	old := NewFSM(nil, nil)
	old.Apply(entryLog(1, memberOp(member{ID: "n1", GRPCAddr: "h:1"})))
	b = persist(old)
	if b[0] != 1 {
		t.Errorf("snapshot without admin addresses: version %d, want 1", b[0])
	}
	state, err := lease.New().MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	v1 := []byte{1, 7, 1} // version 1, index 7, one member
	v1 = appendString(appendString(v1, "n1"), "h:1")
	v1 = append(v1, state...)
	for _, b := range [][]byte{b, v1} {
		g := restore(b)
		if got := g.memberTable(); !maps.Equal(got, map[string]member{"n1": {ID: "n1", GRPCAddr: "h:1"}}) {
			t.Errorf("version 1 snapshot restored as %v", got)
		}
	}
}

// TestFSMRegistry: allow entries register and withdraw ids; a snapshot
// of a registry ever written is version 3 and restores it, even empty
// (so that -initial-members are not seeded again); a bad allow entry
// stops the state machine with nothing applied.
func TestFSMRegistry(t *testing.T) {
	f := NewFSM(nil, nil)
	f.Apply(entryLog(1, memberOps(member{ID: "n1", GRPCAddr: "h:1", AdminAddr: "h:3"})...))
	if ids, written := f.allowedIDs(); len(ids) != 0 || written {
		t.Fatalf("a new FSM's registry: %v (written %v), want empty, never written", ids, written)
	}
	f.Apply(entryLog(2, allowOp("n2", allowRegister), allowOp("n3", allowRegister), allowOp("n1", allowRegister)))
	f.Apply(entryLog(3, allowOp("n3", allowWithdraw)))
	if ids, written := f.allowedIDs(); !slices.Equal(ids, []string{"n1", "n2"}) || !written {
		t.Fatalf("registry %v (written %v), want [n1 n2]", ids, written)
	}
	if !f.isAllowed("n2") || f.isAllowed("n3") {
		t.Errorf("isAllowed n2 %v, n3 %v: want true, false", f.isAllowed("n2"), f.isAllowed("n3"))
	}
	for _, tc := range []struct {
		name    string
		ops     []op
		allowed []string
		written bool
		version byte
	}{
		{"registered", nil, []string{"n1", "n2"}, true, 3},
		{"all withdrawn", []op{allowOp("n1", allowWithdraw), allowOp("n2", allowWithdraw)}, nil, true, 3},
	} {
		if tc.ops != nil {
			f.Apply(entryLog(4, tc.ops...))
		}
		snap, err := f.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := snap.(*fsmSnapshot).write(&b); err != nil {
			t.Fatal(err)
		}
		if b.Bytes()[0] != tc.version {
			t.Errorf("%s: snapshot version %d, want %d", tc.name, b.Bytes()[0], tc.version)
		}
		g := NewFSM(nil, nil)
		if err := g.Restore(io.NopCloser(bytes.NewReader(b.Bytes()))); err != nil {
			t.Fatalf("%s: restore: %v", tc.name, err)
		}
		if ids, written := g.allowedIDs(); !slices.Equal(ids, tc.allowed) || written != tc.written {
			t.Errorf("%s: restored registry %v (written %v), want %v (written %v)", tc.name, ids, written, tc.allowed, tc.written)
		}
		if !maps.Equal(g.memberTable(), f.memberTable()) {
			t.Errorf("%s: restored member table %v, want %v", tc.name, g.memberTable(), f.memberTable())
		}
	}

	// Seeds (a bootstrapping node's -initial-members) register together
	// in a registry never written, and change nothing after: a restarted
	// first node does not undo a removal.
	s := NewFSM(nil, nil)
	s.Apply(entryLog(1, allowOp("a", allowSeed), allowOp("b", allowSeed)))
	s.Apply(entryLog(2, allowOp("b", allowWithdraw)))
	s.Apply(entryLog(3, allowOp("b", allowSeed), allowOp("c", allowSeed)))
	if ids, _ := s.allowedIDs(); !slices.Equal(ids, []string{"a"}) {
		t.Errorf("registry after seeds, a withdrawal and seeds again: %v, want [a]", ids)
	}

	var stops []error
	h := NewFSM(nil, func(err error) { stops = append(stops, err) })
	bad := allowOp("n9", allowRegister)
	bad.data = append(bad.data, 7) // a byte after the flag
	h.Apply(entryLog(1, allowOp("n8", allowRegister), bad))
	if ids, written := h.allowedIDs(); len(ids) != 0 || written || len(stops) != 1 {
		t.Errorf("after a bad allow entry: registry %v (written %v), %d stops; want nothing applied, one stop", ids, written, len(stops))
	}
}

// TestFSMSnapshotRestore persists a snapshot through a real file snapshot
// store and restores it into a new FSM: same state bytes, members, index.
// A corrupt snapshot is refused and changes nothing.
func TestFSMSnapshotRestore(t *testing.T) {
	f, _ := newTestFSM(t)
	f.Apply(entryLog(2, memberOp(member{ID: "n1", GRPCAddr: "127.0.0.1:9"}),
		commandOp(mustEncode(t, lease.Grant{Now: 3, Holder: "a", Seq: 1, Quota: "hot|", Demand: 4}))))
	store, err := raft.NewFileSnapshotStoreWithLogger(t.TempDir(), 2, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Apply after the snapshot was taken must not leak into it.
	f.Apply(entryLog(3, commandOp(mustEncode(t, lease.Tick{Now: 9e6}))))
	sink, err := store.Create(raft.SnapshotVersionMax, 2, 1, raft.Configuration{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	g := NewFSM(nil, nil)
	_, rc, err := store.Open(sink.ID())
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Restore(rc); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	want := NewFSM(nil, nil)
	want.Apply(entryLog(1, configureOp(t, 1)))
	want.Apply(entryLog(2, memberOp(member{ID: "n1", GRPCAddr: "127.0.0.1:9"}),
		commandOp(mustEncode(t, lease.Grant{Now: 3, Holder: "a", Seq: 1, Quota: "hot|", Demand: 4}))))
	if got, w := stateBytes(t, g), stateBytes(t, want); !bytes.Equal(got, w) {
		t.Errorf("restored state\n%s\nwant the state at the snapshot\n%s", got, w)
	}
	if _, idx := g.State(); idx != 2 {
		t.Errorf("restored index %d, want 2", idx)
	}
	if !maps.Equal(g.Members(), want.Members()) || g.Restores() != 1 {
		t.Errorf("restored members %v (restores %d), want %v (1)", g.Members(), g.Restores(), want.Members())
	}

	for _, bad := range [][]byte{nil, {9}, {snapshotVersion, 2, 0, '{'}, {snapshotVersion, 2, 1, 200}} {
		before := stateBytes(t, g)
		if err := g.Restore(io.NopCloser(bytes.NewReader(bad))); !errors.Is(err, ErrBadEntry) {
			t.Errorf("Restore(%x) = %v, want ErrBadEntry", bad, err)
		}
		if !bytes.Equal(stateBytes(t, g), before) {
			t.Errorf("Restore(%x) changed the state", bad)
		}
	}
}
