package lease

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// raceEnabled is set by race_test.go under -race.
var raceEnabled bool

// quotaS is quotaQ with MaxSlice 1: a holder's share is at most 1 token/s
// and 10 tokens, however the rest of the quota is shared, so the pool's
// arithmetic below does not depend on the sharing policy.
func quotaS(now int64) ConfigureQuota {
	c := quotaQ(now)
	c.MaxSlice = 1
	return c
}

func cfgS() *QuotaConfig {
	c := quotaS(0).Config()
	return &c
}

// cfgQ is quotaQ's shape, as a grant carries it.
func cfgQ() *QuotaConfig {
	c := quotaQ(0).Config()
	return &c
}

// cfgR is a shape of rule "r" with at most max quotas.
func cfgR(max int) *QuotaConfig {
	return &QuotaConfig{Burst: 10, Rate: 1, LeasePeriod: 10 * sec, SafetyMargin: sec, Rule: "r", MaxSubjects: max}
}

func configureR(now int64, quota string, max int) ConfigureQuota {
	c := cfgR(max)
	return ConfigureQuota{Now: now, Quota: quota, Burst: c.Burst, Rate: c.Rate, LeasePeriod: c.LeasePeriod,
		SafetyMargin: c.SafetyMargin, Rule: c.Rule, MaxSubjects: c.MaxSubjects}
}

func wantExists(quota string) check {
	return func(t *testing.T, s *State, _ Result) {
		t.Helper()
		if _, ok := s.Quota(quota); !ok {
			t.Errorf("quota %q was removed, want it kept", quota)
		}
	}
}

func wantSubjects(rule string, n int) check {
	return func(t *testing.T, s *State, _ Result) {
		t.Helper()
		if got := s.Subjects(rule); got != n {
			t.Errorf("rule %q has %d quotas, want %d", rule, got, n)
		}
	}
}

func wantErr(err error) check {
	return func(t *testing.T, _ *State, r Result) {
		t.Helper()
		// The answer's error is checked by run; this checks the replay.
		if !r.Replayed {
			t.Errorf("want a replayed answer wrapping %v, got %+v", err, r)
		}
	}
}

// TestRemoval: Tick removes a quota exactly when it is what a new quota of
// its shape would be (no lease, no funding, pool full), and a grant brings
// it back as new.
func TestRemoval(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{"a quota whose lease is given back whole is removed at the next tick", []step{
			{cmd: quotaS(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 1}, want: []check{wantPool("q", 90)}},
			{cmd: Release{Holder: "a", Seq: 2, LeaseID: 1, Unused: 10}, want: []check{wantPool("q", 100), wantExists("q")}},
			{cmd: Tick{Now: 0}, want: []check{wantGone("q")}},
		}},
		{"a live lease keeps its quota", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 0}},
			{cmd: Tick{Now: 5 * sec}, want: []check{wantExists("q"), wantLeases("q", 1)}},
		}},
		{"an expired lease keeps its quota until it is reclaimed and the pool has refilled", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}, want: []check{wantPool("q", 0)}},
			{cmd: Tick{Now: 11 * sec}, want: []check{wantExists("q"), wantLeases("q", 1)}},
			{cmd: Tick{Now: 11*sec + 1}, want: []check{wantReclaimed(1), wantExists("q"), wantPool("q", 0)}},
			{cmd: Tick{Now: 21 * sec}, want: []check{wantExists("q"), wantPool("q", 99.99999)}},
			{cmd: Tick{Now: 21*sec + 1}, want: []check{wantGone("q")}},
		}},
		{"a fixed allowance (rate 0) that was spent is never removed", []step{
			{cmd: ConfigureQuota{Quota: "z", Burst: 5, LeasePeriod: sec, MaxSlice: 1}},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "z", Demand: 1}},
			{cmd: Release{Holder: "a", Seq: 2, LeaseID: 1, Unused: 0}},
			{cmd: Tick{Now: 1000 * sec}, want: []check{wantExists("z"), wantPool("z", 4)}},
		}},
		{"an active funding keeps a funded quota, until it ends", []step{
			{cmd: quotaF(0)},
			{cmd: Fund{Quota: "f", Burst: 10, Rate: 1, Deposit: 10, NotAfter: 5 * sec}, want: []check{wantPool("f", 20)}},
			{cmd: Tick{Now: sec}, want: []check{wantExists("f")}},
			{cmd: Tick{Now: 5 * sec}, want: []check{wantGone("f")}},
		}},
		{"a removed quota comes back full with a grant's config, as new", []step{
			{cmd: quotaQ(0)},
			{cmd: Tick{Now: sec}, want: []check{wantGone("q")}},
			{cmd: Grant{Now: sec, Holder: "a", Seq: 1, Quota: "q", Demand: 100, Config: cfgQ()},
				want: []check{wantGranted(1, 100, 100, 10, 11*sec), wantPool("q", 0)}},
		}},
		{"a grant without config for a removed quota is refused and changes nothing", []step{
			{cmd: quotaQ(0)},
			{cmd: Tick{Now: sec}},
			{cmd: Grant{Now: sec, Holder: "a", Seq: 1, Quota: "q", Demand: 1}, err: ErrUnknownQuota},
		}},
		{"a renewal of a lease whose quota is gone is told to grant again", []step{
			{cmd: quotaS(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 1}},
			// Reclaimed after the pool's refill: the tick after removes it.
			{cmd: Tick{Now: 30 * sec}, want: []check{wantReclaimed(1), wantExists("q")}},
			{cmd: Tick{Now: 31 * sec}, want: []check{wantGone("q")}},
			{cmd: renew1(31*sec, "a", 2, 1, 0, 1, 10, 1), want: []check{wantItem(0, ErrLeaseExpired, 0, 0, 0, 0)}},
		}},
		{"a retried grant whose quota was removed since is replayed, nothing recreated", []step{
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 1, Config: cfgS()}},
			{cmd: Tick{Now: 30 * sec}, want: []check{wantReclaimed(1)}},
			{cmd: Tick{Now: 31 * sec}, want: []check{wantGone("q")}},
			{cmd: Grant{Now: 31 * sec, Holder: "a", Seq: 1, Quota: "q", Demand: 1, Config: cfgS()},
				want: []check{wantReplayed(true), wantGone("q")}},
			{cmd: Grant{Now: 31 * sec, Holder: "a", Seq: 1, Quota: "q", Demand: 1},
				want: []check{wantReplayed(true), wantGone("q")}},
		}},
		{"a grant's config does not reshape a quota in use", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 1}},
			{cmd: Grant{Holder: "b", Seq: 1, Quota: "q", Demand: 1, Config: &QuotaConfig{Burst: 7, Rate: 1, LeasePeriod: sec}},
				want: []check{wantCeil("q", 100, 10), wantLeases("q", 2)}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { run(t, tt.steps) })
	}
}

// TestMaxSubjects: no command creates a quota of a rule that already has
// max_subjects; a grant's refusal is an answer, recorded and replayed.
func TestMaxSubjects(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{"configure refuses the quota past the limit, and changes nothing", []step{
			{cmd: configureR(0, "r|a", 2)},
			{cmd: configureR(0, "r|b", 2), want: []check{wantSubjects("r", 2)}},
			{cmd: configureR(sec, "r|c", 2), err: ErrTooManySubjects, want: []check{wantGone("r|c"), wantSubjects("r", 2), wantNow(0)}},
			// An idle quota is as good as removed: a new shape for it is a
			// creation, which this lower limit refuses.
			{cmd: configureR(sec, "r|a", 1), err: ErrTooManySubjects, want: []check{wantSubjects("r", 2)}},
		}},
		{"a grant past the limit is answered too many subjects, and the answer replays", []step{
			{cmd: Grant{Holder: "h", Seq: 1, Quota: "r|a", Demand: 1, Config: cfgR(2)}},
			{cmd: Grant{Holder: "h", Seq: 2, Quota: "r|b", Demand: 1, Config: cfgR(2)}},
			{cmd: Grant{Holder: "h", Seq: 3, Quota: "r|c", Demand: 1, Config: cfgR(2)}, err: ErrTooManySubjects,
				want: []check{wantGone("r|c"), wantSubjects("r", 2), wantReplayed(false)}},
			{cmd: Grant{Holder: "h", Seq: 3, Quota: "r|c", Demand: 1, Config: cfgR(2)}, err: ErrTooManySubjects,
				want: []check{wantErr(ErrTooManySubjects), wantGone("r|c")}},
			// Other rules, and quotas of no rule, are not counted.
			{cmd: Grant{Holder: "h", Seq: 4, Quota: "q", Demand: 1, Config: cfgQ()}, want: []check{wantSubjects("r", 2)}},
		}},
		{"once a quota of the rule is removed, another may be created", []step{
			{cmd: Grant{Holder: "h", Seq: 1, Quota: "r|a", Demand: 1, Config: cfgR(1)}},
			{cmd: Grant{Holder: "h", Seq: 2, Quota: "r|b", Demand: 1, Config: cfgR(1)}, err: ErrTooManySubjects},
			{cmd: Release{Holder: "h", Seq: 3, LeaseID: 1, Unused: 10}},
			{cmd: Tick{Now: 0}, want: []check{wantGone("r|a"), wantSubjects("r", 0)}},
			{cmd: Grant{Holder: "h", Seq: 4, Quota: "r|b", Demand: 1, Config: cfgR(1)}, want: []check{wantSubjects("r", 1), wantExists("r|b")}},
		}},
		{"lowering the limit removes nothing, and reshapes quotas in use", []step{
			{cmd: Grant{Holder: "h", Seq: 1, Quota: "r|a", Demand: 1, Config: cfgR(3)}},
			{cmd: Grant{Holder: "h", Seq: 2, Quota: "r|b", Demand: 1, Config: cfgR(3)}},
			{cmd: Grant{Holder: "h", Seq: 3, Quota: "r|c", Demand: 1, Config: cfgR(3)}},
			{cmd: configureR(0, "r|b", 1), want: []check{wantSubjects("r", 3), wantLeases("r|b", 1)}},
			{cmd: configureR(0, "r|d", 1), err: ErrTooManySubjects, want: []check{wantSubjects("r", 3)}},
		}},
		{"max_subjects needs a rule, and a sane bound", []step{
			{cmd: ConfigureQuota{Quota: "q", Burst: 1, LeasePeriod: sec, MaxSubjects: 1}, err: ErrInvalid},
			{cmd: ConfigureQuota{Quota: "q", Burst: 1, LeasePeriod: sec, Rule: "r", MaxSubjects: -1}, err: ErrInvalid},
			{cmd: ConfigureQuota{Quota: "q", Burst: 1, LeasePeriod: sec, Rule: "r", MaxSubjects: MaxSubjectsLimit + 1}, err: ErrInvalid},
			{cmd: Grant{Holder: "h", Seq: 1, Quota: "q", Config: &QuotaConfig{Burst: 1, LeasePeriod: sec, MaxSubjects: 1}}, err: ErrInvalid},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { run(t, tt.steps) })
	}
}

// TestSnapshotVersions: a state that uses nothing of version 2 is written
// as version 1 (older replicas restore it); max_subjects and the too many
// subjects answer make it version 2, and survive the round trip.
func TestSnapshotVersions(t *testing.T) {
	tests := []struct {
		name    string
		cmds    []Command
		version string
	}{
		{"plain", []Command{quotaQ(0), Grant{Holder: "h", Seq: 1, Quota: "q", Demand: 1, Config: cfgQ()}}, `"version":1`},
		{"max_subjects", []Command{configureR(0, "r|a", 1)}, `"version":2`},
		{"too many subjects answer", []Command{
			configureR(0, "r|a", 1), Grant{Holder: "h", Seq: 1, Quota: "r|b", Config: cfgR(1)},
			ConfigureQuota{Quota: "r|a", Burst: 10, Rate: 1, LeasePeriod: 10 * sec, SafetyMargin: sec}, // no rule any more
		}, `"version":2`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New()
			for _, c := range tt.cmds {
				s.Apply(c)
			}
			b, err := s.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(b, []byte(tt.version)) {
				t.Fatalf("snapshot %s, want %s", b, tt.version)
			}
			u := New()
			if err := u.UnmarshalBinary(b); err != nil {
				t.Fatal(err)
			}
			if ub, _ := u.MarshalBinary(); !bytes.Equal(ub, b) {
				t.Fatalf("round trip differs:\n%s\n%s", b, ub)
			}
			if u.Subjects("r") != s.Subjects("r") {
				t.Fatalf("subjects of r: %d after the round trip, %d before", u.Subjects("r"), s.Subjects("r"))
			}
			r1, e1 := s.Apply(Grant{Holder: "h", Seq: 1, Quota: "r|b", Config: cfgR(1)})
			r2, e2 := u.Apply(Grant{Holder: "h", Seq: 1, Quota: "r|b", Config: cfgR(1)})
			if errString(e1) != errString(e2) || !sameResult(r1, r2) {
				t.Fatalf("replay after the round trip: %+v, %v; before %+v, %v", r2, e2, r1, e1)
			}
			if !bytes.Contains(b, []byte(`"version":2`)) {
				return
			}
			old := bytes.Replace(b, []byte(`"version":2`), []byte(`"version":1`), 1)
			if err := New().UnmarshalBinary(old); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("version 1 snapshot with version 2 contents: %v, want ErrCorrupt", err)
			}
		})
	}
}

// boundsSample is one measurement of a state.
type boundsSample struct {
	quotas   int
	heap     uint64 // live heap after GC, bytes
	snapshot int    // MarshalBinary length, bytes
	tick     time.Duration
}

func sampleState(t *testing.T, s *State, now int64) boundsSample {
	t.Helper()
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	b, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	// A Tick at now changes nothing more (the wave's tick already ran at
	// now), so timing it does not disturb the state.
	start := time.Now()
	if _, err := s.Apply(Tick{Now: now}); err != nil {
		t.Fatal(err)
	}
	return boundsSample{quotas: s.NumQuotas(), heap: m.HeapAlloc, snapshot: len(b), tick: time.Since(start)}
}

// TestBoundedState: a million distinct subjects over time, in waves of
// 10,000 grants that are then given back: once a wave is idle, the state
// holds none of its quotas, and the live heap, the snapshot and the tick
// stay where they were after the first wave, however many subjects came
// before. (Before idle quotas were removed, every one stayed: a million
// quotas in memory, in every snapshot and in every tick.) Sizes are
// asserted, times logged. -short and -race run 100,000 subjects.
func TestBoundedState(t *testing.T) {
	const wave, holders = 10_000, 100
	subjects := 1_000_000
	if testing.Short() || raceEnabled {
		subjects = 100_000
	}
	cfg := &QuotaConfig{Burst: 100, Rate: 10, LeasePeriod: 10 * sec, SafetyMargin: sec, Rule: "tenant", MaxSubjects: 2 * wave}
	s := New()
	seq := make([]uint64, holders)
	now := int64(1000 * sec)
	apply := func(c Command) Result {
		r, err := s.Apply(c)
		if err != nil {
			t.Fatalf("Apply(%+v): %v", c, err)
		}
		return r
	}
	var live, idle, first boundsSample
	var worstHeap uint64
	var worstSnap int
	var worstTick time.Duration
	ids := make([]uint64, wave)
	for w := range subjects / wave {
		// 10,000 new subjects, 100 per holder, each taking its whole quota.
		for i := range wave {
			h := i % holders
			seq[h]++
			l := apply(Grant{Now: now, Holder: fmt.Sprintf("agent-%d", h), Seq: seq[h],
				Quota: fmt.Sprintf("tenant|t%d", w*wave+i), Demand: 10, Config: cfg}).Lease
			ids[i] = l.ID
		}
		if w == 0 {
			live = sampleState(t, s, now)
		}
		// Half give everything back; half give back nothing, and their
		// pools refill within B/r = 10s.
		for i := range wave {
			h := i % holders
			seq[h]++
			unused := 0.0
			if i%2 == 0 {
				unused = cfg.Burst
			}
			apply(Release{Now: now, Holder: fmt.Sprintf("agent-%d", h), Seq: seq[h], LeaseID: ids[i], Unused: unused})
		}
		now += 11 * sec
		apply(Tick{Now: now})
		idle = sampleState(t, s, now)
		if w == 0 {
			first = idle
		}
		worstHeap, worstSnap, worstTick = max(worstHeap, idle.heap), max(worstSnap, idle.snapshot), max(worstTick, idle.tick)
		if idle.quotas != 0 {
			t.Fatalf("wave %d: %d quotas left once idle, want 0", w, idle.quotas)
		}
		if s.Subjects("tenant") != 0 {
			t.Fatalf("wave %d: rule counts %d quotas, want 0", w, s.Subjects("tenant"))
		}
	}
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d subjects in waves of %d: with %d live quotas: heap %d KiB, snapshot %d KiB, tick %v",
		subjects, wave, live.quotas, live.heap>>10, live.snapshot>>10, live.tick)
	t.Logf("idle after the first wave: heap %d KiB, snapshot %d B, tick %v; worst idle after any wave: heap %d KiB, snapshot %d B, tick %v; after the last: heap %d KiB, snapshot %d B, tick %v",
		first.heap>>10, first.snapshot, first.tick, worstHeap>>10, worstSnap, worstTick, idle.heap>>10, idle.snapshot, idle.tick)
	// Flat: what is left (holders' records) does not grow with the
	// subjects seen. The heap gets slack for the GC's and the runtime's
	// own noise, far below what one wave's quotas take.
	if worstSnap > first.snapshot+first.snapshot/10+1024 {
		t.Errorf("idle snapshot grew from %d to %d bytes", first.snapshot, worstSnap)
	}
	if slack := (live.heap - first.heap) / 4; worstHeap > first.heap+slack {
		t.Errorf("idle heap grew from %d KiB to %d KiB (one wave live: %d KiB)", first.heap>>10, worstHeap>>10, live.heap>>10)
	}
}
