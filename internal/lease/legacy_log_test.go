package lease

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"testing"
)

// The log in testdata/log-04749d6.bin was written by the encoder of
// commit 04749d6 (every command as JSON, versions 1 to 3), before Renew
// had its binary encoding (version 4), from legacyScenario: one uvarint
// length and one encoded command after another. Its replay's answers and
// final state are testdata/log-04749d6.results.json and
// testdata/log-04749d6.state.json, as that commit computed them. The
// files are never regenerated: they are what a log on disk holds after an
// upgrade, and a newer version must replay it identically.
const (
	legacyLog     = "testdata/log-04749d6.bin"
	legacyResults = "testdata/log-04749d6.results.json"
	legacyState   = "testdata/log-04749d6.state.json"
)

// legacyScenario exercises every kind and every optional field: grants
// (with and without a quota shape, a start-empty one), renewals with
// bounds, weights, confirmations, an expired and a foreign lease, a
// replayed and a stale command, releases, funding, tuning, ticks that
// reclaim, and a change of leader.
func legacyScenario() []Command {
	const t0 = int64(1_800_000_000) * sec
	cfg := QuotaConfig{Burst: 100, Rate: 10, LeasePeriod: 10 * sec, MinSlice: 0.5, MaxSlice: 8, SafetyMargin: sec, Rule: "per-tenant", MaxSubjects: 10}
	empty := QuotaConfig{Burst: 40, Rate: 4, LeasePeriod: 5 * sec, SafetyMargin: sec / 2, Rule: "hot", StartEmpty: true}
	return []Command{
		LeaderElected{Now: t0},
		ConfigureQuota{Now: t0 + 1, Quota: "plain", Burst: 50, Rate: 5, LeasePeriod: 10 * sec, SafetyMargin: sec},
		ConfigureQuota{Now: t0 + 2, Quota: "funded", Burst: 10, Rate: 1, LeasePeriod: 10 * sec, SafetyMargin: sec, Funded: true},
		Fund{Now: t0 + 3, Quota: "funded", Burst: 90, Rate: 9, Deposit: 60, NotAfter: t0 + 30*sec},
		Grant{Now: t0 + 10, Holder: "a/1", Seq: 1, Quota: "per-tenant|acme", Demand: 3, Config: &cfg},
		Grant{Now: t0 + 20, Holder: "b/1", Seq: 1, Quota: "per-tenant|acme", Demand: 12.5, Weight: 2, Config: &cfg},
		Grant{Now: t0 + 30, Holder: "a/1", Seq: 2, Quota: "plain", Demand: 1, Bounds: &Bounds{Period: 3 * sec, MinSlice: 0.25, MaxSlice: 4}},
		Grant{Now: t0 + 40, Holder: "c/1", Seq: 7, Quota: "hot|k", Demand: 2, Config: &empty},
		Grant{Now: t0 + 50, Holder: "c/1", Seq: 8, Quota: "funded", Demand: 20},
		Tune{Now: t0 + 60, Tuning: Tuning{Rule: "per-tenant", Region: "", LeasePeriod: 8 * sec, Weight: 2}},
		Renew{Now: t0 + sec, Holder: "a/1", Seq: 3, Items: []RenewItem{
			{LeaseID: 1, Quota: "per-tenant|acme", Unused: 0.5, Demand: 4, Weight: 1, ConfirmedCap: 1.0 / 3, ConfirmedRate: 0.1},
			{LeaseID: 3, Quota: "plain", Unused: 0, Demand: 2, Bounds: &Bounds{MinSlice: 0, MaxSlice: 3}},
			{LeaseID: 2, Quota: "per-tenant|acme", Demand: 1},
			{LeaseID: 99, Quota: "nope", Demand: 1},
		}},
		Renew{Now: t0 + sec + 5, Holder: "a/1", Seq: 3, Items: []RenewItem{{LeaseID: 1, Quota: "per-tenant|acme", Demand: 4}}},
		Renew{Now: t0 + sec + 6, Holder: "a/1", Seq: 2, Items: []RenewItem{{LeaseID: 1, Quota: "per-tenant|acme", Demand: 4}}},
		Renew{Now: t0 + 2*sec, Holder: "b/1", Seq: 2, Items: []RenewItem{
			{LeaseID: 2, Quota: "per-tenant|acme", Unused: 3.25, Demand: 0.75, Weight: 2, ConfirmedCap: 50, ConfirmedRate: 5},
		}},
		Renew{Now: t0 + 2*sec + 1, Holder: "c/1", Seq: 9, Items: []RenewItem{
			{LeaseID: 4, Quota: "hot|k", Demand: 2.5, ConfirmedCap: 0, ConfirmedRate: 0},
			{LeaseID: 5, Quota: "funded", Unused: 1, Demand: 30, ConfirmedCap: 10, ConfirmedRate: 1},
		}},
		Tick{Now: t0 + 3*sec},
		Release{Now: t0 + 4*sec, Holder: "a/1", Seq: 4, LeaseID: 3, Unused: 0.125},
		Release{Now: t0 + 4*sec + 1, Holder: "b/1", Seq: 3, LeaseID: 1, Unused: 1},
		Renew{Now: t0 + 5*sec, Holder: "b/1", Seq: 4, Items: []RenewItem{
			{LeaseID: 2, Quota: "per-tenant|acme", Unused: 0, Demand: 9, Weight: 2, ConfirmedCap: 25, ConfirmedRate: 2.5},
		}},
		LeaderElected{Now: t0 + 6*sec},
		Tick{Now: t0 + 20*sec},
		Renew{Now: t0 + 21*sec, Holder: "a/1", Seq: 5, Items: []RenewItem{{LeaseID: 1, Quota: "per-tenant|acme", Demand: 4}}},
		Grant{Now: t0 + 21*sec + 1, Holder: "a/1", Seq: 6, Quota: "per-tenant|acme", Demand: 4, Config: &cfg},
		Tick{Now: t0 + 22*sec},
		Renew{Now: t0 + 23*sec, Holder: "a/1", Seq: 7, Items: []RenewItem{{LeaseID: 6, Quota: "per-tenant|acme", Unused: 2, Demand: 6, ConfirmedCap: 80, ConfirmedRate: 8}}},
		Renew{Now: t0 + 24*sec, Holder: "b/1", Seq: 5, Items: []RenewItem{}},
		Renew{Now: t0 + 24*sec, Holder: "b/1", Seq: 6},
	}
}

// describeResult is a result and its error as comparable text.
func describeResult(r Result, err error) string {
	type item struct {
		LeaseID  uint64
		Quota    string
		Lease    *Lease
		Credited float64
		Err      string
	}
	d := struct {
		Lease     *Lease
		Items     []item
		Credited  float64
		Reclaimed []uint64
		Replayed  bool
		Err       string
	}{Lease: r.Lease, Credited: r.Credited, Reclaimed: r.Reclaimed, Replayed: r.Replayed}
	for _, it := range r.Items {
		e := ""
		if it.Err != nil {
			e = it.Err.Error()
		}
		d.Items = append(d.Items, item{it.LeaseID, it.Quota, it.Lease, it.Credited, e})
	}
	if err != nil {
		d.Err = err.Error()
	}
	b, _ := json.Marshal(d)
	return string(b)
}

// replay applies cmds to a new state: its answers and its encoding.
func replay(t *testing.T, cmds []Command) ([]string, []byte) {
	t.Helper()
	s := New()
	var results []string
	for _, c := range cmds {
		results = append(results, describeResult(s.Apply(c)))
		if err := s.CheckInvariants(); err != nil {
			t.Fatalf("after %+v: %v", c, err)
		}
	}
	b, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return results, b
}

// readLegacyLog decodes the committed log.
func readLegacyLog(t *testing.T) ([]Command, [][]byte) {
	t.Helper()
	data, err := os.ReadFile(legacyLog)
	if err != nil {
		t.Fatal(err)
	}
	var cmds []Command
	var raw [][]byte
	for len(data) > 0 {
		n, k := binary.Uvarint(data)
		if k <= 0 || n > uint64(len(data)-k) {
			t.Fatalf("%s: entry %d: bad length", legacyLog, len(cmds))
		}
		b := data[k : k+int(n)]
		data = data[k+int(n):]
		c, err := DecodeCommand(b)
		if err != nil {
			t.Fatalf("%s: entry %d (version %d): %v", legacyLog, len(cmds), b[1], err)
		}
		cmds = append(cmds, c)
		raw = append(raw, b)
	}
	return cmds, raw
}

// TestLegacyLogReplays: a log written before Renew's binary encoding
// decodes to the commands that wrote it and replays to the same answers and
// the same state, byte for byte; re-encoded with today's encoder (renewals
// in binary), it replays identically too, so replicas that applied one
// form or the other agree.
func TestLegacyLogReplays(t *testing.T) {
	cmds, raw := readLegacyLog(t)
	want := legacyScenario()
	if !reflect.DeepEqual(cmds, want) {
		t.Fatalf("the log decodes to\n%+v\nwant\n%+v", cmds, want)
	}
	for i, b := range raw {
		if b[1] > 3 {
			t.Errorf("entry %d has version %d: not a log of JSON commands", i, b[1])
		}
	}
	wantResults, err := os.ReadFile(legacyResults)
	if err != nil {
		t.Fatal(err)
	}
	wantState, err := os.ReadFile(legacyState)
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, cmds []Command) {
		results, state := replay(t, cmds)
		got, _ := json.MarshalIndent(results, "", "  ")
		if !bytes.Equal(append(got, '\n'), wantResults) {
			t.Errorf("%s: answers differ from %s:\n%s", name, legacyResults, got)
		}
		if !bytes.Equal(append(state, '\n'), wantState) {
			t.Errorf("%s: state differs from %s:\n%s", name, legacyState, state)
		}
	}
	check("the log", cmds)
	var again []Command
	for i, c := range cmds {
		b, err := EncodeCommand(c)
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		d, err := DecodeCommand(b)
		if err != nil {
			t.Fatalf("entry %d re-encoded (version %d): %v", i, b[1], err)
		}
		again = append(again, d)
	}
	check("re-encoded", again)
}

// writeLegacyLog wrote the testdata at 04749d6; kept to show how, never to
// be run again (see legacyLog).
func writeLegacyLog(t *testing.T) {
	var log []byte
	for _, c := range legacyScenario() {
		b, err := EncodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		log = binary.AppendUvarint(log, uint64(len(b)))
		log = append(log, b...)
	}
	results, state := replay(t, legacyScenario())
	res, _ := json.MarshalIndent(results, "", "  ")
	for name, b := range map[string][]byte{legacyLog: log, legacyResults: append(res, '\n'), legacyState: append(state, '\n')} {
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Println("wrote", legacyLog)
}

var _ = writeLegacyLog
