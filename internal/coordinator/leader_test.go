package coordinator

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/lease"
)

// newBuildNode is the part of a Node that build needs: no Raft, no network.
func newBuildNode(t *testing.T) (*Node, *term) {
	t.Helper()
	n := &Node{cfg: DefaultConfig(), logger: slog.New(slog.DiscardHandler), clock: time.Now, fsm: NewFSM(nil, nil)}
	tm := &term{configured: map[string]lease.QuotaConfig{}}
	tm.startClock(time.Now(), 0, 0)
	return n, tm
}

func configure(quota string, burst float64) lease.ConfigureQuota {
	return lease.ConfigureQuota{Quota: quota, Burst: burst, Rate: 1, LeasePeriod: 2e6}
}

func renewProposal(holder string, items int, configs ...lease.ConfigureQuota) *proposal {
	r := lease.Renew{Holder: holder, Seq: 1}
	for i := range items {
		r.Items = append(r.Items, lease.RenewItem{LeaseID: uint64(i + 1), Quota: fmt.Sprintf("q|%0100d", i)})
	}
	return &proposal{ops: []pendingOp{{cmd: r}}, configs: configs, done: make(chan proposalResult, 1)}
}

func entryKinds(t *testing.T, b *entryBuild) []string {
	t.Helper()
	var out []string
	for _, o := range b.ops {
		c, err := lease.DecodeCommand(o.data)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c.Kind().String())
	}
	return out
}

// TestBuildConfiguresOnce: a quota several queued requests need reshaped is
// configured once per entry and once per term; one already configured with
// the same shape is not configured again; a changed shape is; one that does
// not exist is not configured (a grant creates it from its own shape).
func TestBuildConfiguresOnce(t *testing.T) {
	n, tm := newBuildNode(t)
	n.fsm.Apply(entryLog(1, commandOp(mustEncode(t, lease.ConfigureQuota{Now: 1, Quota: "old|", Burst: 5, Rate: 1, LeasePeriod: 2e6}))))
	n.fsm.Apply(entryLog(2, commandOp(mustEncode(t, lease.ConfigureQuota{Now: 1, Quota: "new|", Burst: 9, Rate: 1, LeasePeriod: 2e6}))))
	steps := []struct {
		props []*proposal
		want  string
	}{
		{[]*proposal{
			renewProposal("a", 1, configure("new|", 10), configure("old|", 5)),
			renewProposal("b", 1, configure("new|", 10)),
		}, "[configure renew renew]"},
		{[]*proposal{renewProposal("c", 1, configure("new|", 10))}, "[renew]"},
		{[]*proposal{renewProposal("d", 1, configure("old|", 7))}, "[configure renew]"},
		{[]*proposal{renewProposal("e", 1, configure("gone|", 3))}, "[renew]"},
	}
	for i, s := range steps {
		b, rest := n.build(tm, s.props)
		if len(rest) != 0 {
			t.Fatalf("step %d: %d proposals left over", i, len(rest))
		}
		if got := fmt.Sprint(entryKinds(t, b)); got != s.want {
			t.Errorf("step %d: entry holds %s, want %s", i, got, s.want)
		}
		if len(b.offsets) != len(s.props) || b.ops[b.offsets[len(b.offsets)-1]].typ != entryCommand {
			t.Errorf("step %d: offsets %v", i, b.offsets)
		}
	}
	// A failed entry forgets what it configured, so the next one retries.
	tm.forget([]string{"new|"})
	b, _ := n.build(tm, []*proposal{renewProposal("e", 1, configure("new|", 10))})
	if got := fmt.Sprint(entryKinds(t, b)); got != "[configure renew]" {
		t.Errorf("after a failed entry: %s, want [configure renew]", got)
	}
}

// TestBuildGivesGrantsTheirShape: every Grant carries its quota's shape
// from the proposal's configs, so that it creates the quota if the state
// machine removed it (idle) after the leader cached it as configured.
func TestBuildGivesGrantsTheirShape(t *testing.T) {
	n, tm := newBuildNode(t)
	cfg := configure("t|a", 10)
	cfg.Rule, cfg.MaxSubjects = "t", 5
	tm.configured["t|a"] = cfg.Config() // believed configured this term
	p := &proposal{ops: []pendingOp{
		{cmd: lease.Grant{Holder: "h", Seq: 1, Quota: "t|a", Demand: 1}},
		{cmd: lease.Grant{Holder: "h", Seq: 2, Quota: "t|none", Demand: 1}},
	}, configs: []lease.ConfigureQuota{cfg}, done: make(chan proposalResult, 1)}
	b, _ := n.build(tm, []*proposal{p})
	var got []*lease.QuotaConfig
	for _, o := range b.ops {
		c, err := lease.DecodeCommand(o.data)
		if err != nil {
			t.Fatal(err)
		}
		if g, ok := c.(lease.Grant); ok {
			got = append(got, g.Config)
		}
	}
	if len(got) != 2 || got[0] == nil || *got[0] != cfg.Config() || got[1] != nil {
		t.Fatalf("grants carry %v, want [%+v <nil>]", got, cfg.Config())
	}
}

// TestBuildSplitsLargeEntries: proposals beyond maxEntryBytes wait for the
// next entry, in order; one request alone is never split.
func TestBuildSplitsLargeEntries(t *testing.T) {
	n, tm := newBuildNode(t)
	var props []*proposal
	for i := range 5 {
		props = append(props, renewProposal(fmt.Sprintf("h%d", i), 2000)) // about 350kB each
	}
	b, rest := n.build(tm, props)
	if len(b.props) == 0 || len(rest) == 0 || len(b.props)+len(rest) != 5 {
		t.Fatalf("build kept %d and left %d of 5 large proposals", len(b.props), len(rest))
	}
	if b.bytes > maxEntryBytes {
		t.Errorf("entry of %d bytes, bound %d", b.bytes, maxEntryBytes)
	}
	if rest[0] != props[len(b.props)] {
		t.Error("leftover proposals out of order")
	}
	huge := renewProposal("big", 8000) // about 1.4MB: alone, over the bound
	b, rest = n.build(tm, []*proposal{huge})
	if len(b.props) != 1 || len(rest) != 0 {
		t.Errorf("a single oversized request: kept %d, left %d; want it proposed alone", len(b.props), len(rest))
	}
}

// TestStampIsMonotonic: the term's clock never goes back, whatever the
// wall clock and the state's clock say.
func TestStampIsMonotonic(t *testing.T) {
	n, tm := newBuildNode(t)
	wall := time.Now()
	future := wall.UnixMicro() + 3600e6
	tm.startClock(wall, future, 0) // the state is an hour ahead of this clock
	a := n.stamp(tm)
	if a < future {
		t.Fatalf("stamp %d below the state's clock %d", a, future)
	}
	tm2 := &term{}
	tm2.startClock(wall.Add(-time.Hour), 0, 0) // a later term on a clock stepped back
	if b := n.stamp(tm2); b < a {
		t.Errorf("stamp went back: %d after %d", b, a)
	}
}
