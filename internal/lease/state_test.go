package lease

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

const sec = int64(1e6)

// quotaQ is the quota most cases use: B=100, r=10, D=10s, margin 1s, so a
// lease granted at 0 expires at 10s and is reclaimed after 11s.
func quotaQ(now int64) ConfigureQuota {
	return ConfigureQuota{Now: now, Quota: "q", Burst: 100, Rate: 10, LeasePeriod: 10 * sec, SafetyMargin: sec}
}

// quotaSliced is quotaQ with a MaxSlice: a holder's share stays within it
// (what the demands leave over too), so the rest stays in the pool. Tests of
// the pool's own mechanics use it.
func quotaSliced(now int64, maxSlice float64) ConfigureQuota {
	c := quotaQ(now)
	c.MaxSlice = maxSlice
	return c
}

// step is one command of a scenario and what must come of it.
type step struct {
	cmd Command
	// err is the sentinel the answer must wrap (nil: success). For
	// ErrInvalid, ErrUnknownQuota and ErrStale the step also checks that the
	// state did not change.
	err  error
	want []check
}

type check func(t *testing.T, s *State, r Result)

// run applies the steps in order, checking invariants after every one.
func run(t *testing.T, steps []step) (*State, Result) {
	t.Helper()
	s := New()
	var last Result
	for i, st := range steps {
		before, err := s.MarshalBinary()
		if err != nil {
			t.Fatalf("step %d: MarshalBinary: %v", i, err)
		}
		r, err := s.Apply(st.cmd)
		switch {
		case st.err == nil && err != nil:
			t.Fatalf("step %d: Apply(%+v) = %v, want success", i, st.cmd, err)
		case st.err != nil && !errors.Is(err, st.err):
			t.Fatalf("step %d: Apply(%+v) = %v, want %v", i, st.cmd, err, st.err)
		}
		if err := s.CheckInvariants(); err != nil {
			t.Fatalf("step %d: after %+v: %v", i, st.cmd, err)
		}
		if st.err == ErrInvalid || st.err == ErrUnknownQuota || st.err == ErrStale {
			after, _ := s.MarshalBinary()
			if !bytes.Equal(before, after) {
				t.Fatalf("step %d: rejected %+v changed the state\nbefore %s\nafter  %s", i, st.cmd, before, after)
			}
		}
		for _, c := range st.want {
			c(t, s, r)
		}
		last = r
	}
	return s, last
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(b)) }

func wantGranted(id uint64, balance, cap, rate float64, expiry int64) check {
	return func(t *testing.T, _ *State, r Result) {
		t.Helper()
		l := r.Lease
		if l == nil {
			t.Fatalf("no lease in %+v", r)
		}
		if l.ID != id || !near(l.Balance, balance) || !near(l.Cap, cap) || !near(l.Rate, rate) || l.Expiry != expiry {
			t.Errorf("lease = {id %d balance %v cap %v rate %v expiry %d}, want {%d %v %v %v %d}",
				l.ID, l.Balance, l.Cap, l.Rate, l.Expiry, id, balance, cap, rate, expiry)
		}
	}
}

func wantItem(i int, err error, balance, cap, rate, credited float64) check {
	return func(t *testing.T, _ *State, r Result) {
		t.Helper()
		if i >= len(r.Items) {
			t.Fatalf("item %d of %d", i, len(r.Items))
		}
		it := r.Items[i]
		if !errors.Is(it.Err, err) || (err == nil) != (it.Err == nil) {
			t.Fatalf("item %d: err = %v, want %v", i, it.Err, err)
		}
		if err != nil {
			if it.Lease != nil || it.Credited != 0 {
				t.Errorf("item %d: failed item carries lease %+v, credit %v", i, it.Lease, it.Credited)
			}
			return
		}
		if !near(it.Lease.Balance, balance) || !near(it.Lease.Cap, cap) || !near(it.Lease.Rate, rate) || !near(it.Credited, credited) {
			t.Errorf("item %d = {balance %v cap %v rate %v credited %v}, want {%v %v %v %v}",
				i, it.Lease.Balance, it.Lease.Cap, it.Lease.Rate, it.Credited, balance, cap, rate, credited)
		}
	}
}

func wantPool(quota string, pool float64) check {
	return func(t *testing.T, s *State, _ Result) {
		t.Helper()
		q, ok := s.Quota(quota)
		if !ok || !near(q.Pool, pool) {
			t.Errorf("pool of %q = %v (exists %v), want %v", quota, q.Pool, ok, pool)
		}
	}
}

func wantReserved(quota string, cap, rate float64) check {
	return func(t *testing.T, s *State, _ Result) {
		t.Helper()
		q, _ := s.Quota(quota)
		if !near(q.ReservedCap, cap) || !near(q.ReservedRate, rate) {
			t.Errorf("reserved of %q = (%v, %v), want (%v, %v)", quota, q.ReservedCap, q.ReservedRate, cap, rate)
		}
	}
}

func wantCeil(quota string, burst, rate float64) check {
	return func(t *testing.T, s *State, _ Result) {
		t.Helper()
		q, _ := s.Quota(quota)
		if !near(q.CeilBurst, burst) || !near(q.CeilRate, rate) {
			t.Errorf("ceilings of %q = (%v, %v), want (%v, %v)", quota, q.CeilBurst, q.CeilRate, burst, rate)
		}
	}
}

func wantLeaseRes(id uint64, resCap, resRate float64) check {
	return func(t *testing.T, s *State, _ Result) {
		t.Helper()
		l, ok := s.LeaseByID(id)
		if !ok || !near(l.ReservedCap, resCap) || !near(l.ReservedRate, resRate) {
			t.Errorf("lease %d reserved = (%v, %v) (exists %v), want (%v, %v)", id, l.ReservedCap, l.ReservedRate, ok, resCap, resRate)
		}
	}
}

func wantReclaimAt(id uint64, at int64) check {
	return func(t *testing.T, s *State, _ Result) {
		t.Helper()
		l, ok := s.LeaseByID(id)
		if !ok || l.ReclaimAt != at {
			t.Errorf("lease %d reclaim at %d (exists %v), want %d", id, l.ReclaimAt, ok, at)
		}
	}
}

func wantResUntil(id uint64, at int64) check {
	return func(t *testing.T, s *State, _ Result) {
		t.Helper()
		l, ok := s.LeaseByID(id)
		if !ok || l.ReservedUntil != at {
			t.Errorf("lease %d reserved until %d (exists %v), want %d", id, l.ReservedUntil, ok, at)
		}
	}
}

func wantGone(quota string) check {
	return func(t *testing.T, s *State, _ Result) {
		t.Helper()
		if q, ok := s.Quota(quota); ok {
			t.Errorf("quota %q exists (%+v), want it removed", quota, q)
		}
	}
}

func wantLeases(quota string, n int) check {
	return func(t *testing.T, s *State, _ Result) {
		t.Helper()
		if got := len(s.Leases(quota)); got != n {
			t.Errorf("%q has %d leases, want %d", quota, got, n)
		}
	}
}

func wantReclaimed(ids ...uint64) check {
	return func(t *testing.T, _ *State, r Result) {
		t.Helper()
		if len(r.Reclaimed) != len(ids) {
			t.Fatalf("reclaimed %v, want %v", r.Reclaimed, ids)
		}
		for i := range ids {
			if r.Reclaimed[i] != ids[i] {
				t.Fatalf("reclaimed %v, want %v", r.Reclaimed, ids)
			}
		}
	}
}

func wantCredited(c float64) check {
	return func(t *testing.T, _ *State, r Result) {
		t.Helper()
		if !near(r.Credited, c) {
			t.Errorf("credited %v, want %v", r.Credited, c)
		}
	}
}

func wantReplayed(replayed bool) check {
	return func(t *testing.T, _ *State, r Result) {
		t.Helper()
		if r.Replayed != replayed {
			t.Errorf("replayed = %v, want %v", r.Replayed, replayed)
		}
	}
}

func wantNow(now int64) check {
	return func(t *testing.T, s *State, _ Result) {
		t.Helper()
		if s.Now() != now {
			t.Errorf("now = %d, want %d", s.Now(), now)
		}
	}
}

func renew1(now int64, holder string, seq, id uint64, unused, demand, ccap, crate float64) Renew {
	return Renew{Now: now, Holder: holder, Seq: seq, Items: []RenewItem{{
		LeaseID: id, Quota: "q", Unused: unused, Demand: demand, ConfirmedCap: ccap, ConfirmedRate: crate,
	}}}
}

func TestConfigureQuota(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name  string
		steps []step
	}{
		{"new quota starts full", []step{
			{cmd: quotaQ(0), want: []check{wantPool("q", 100), wantCeil("q", 100, 10), wantLeases("q", 0)}},
		}},
		{"invalid values are all rejected", []step{
			{cmd: ConfigureQuota{Quota: "q", Burst: nan, Rate: 10, LeasePeriod: sec}, err: ErrInvalid},
			{cmd: ConfigureQuota{Quota: "q", Burst: 0, Rate: 10, LeasePeriod: sec}, err: ErrInvalid},
			{cmd: ConfigureQuota{Quota: "q", Burst: 10, Rate: -1, LeasePeriod: sec}, err: ErrInvalid},
			{cmd: ConfigureQuota{Quota: "q", Burst: 10, Rate: math.Inf(1), LeasePeriod: sec}, err: ErrInvalid},
			{cmd: ConfigureQuota{Quota: "q", Burst: 10, Rate: 1e-9, LeasePeriod: sec}, err: ErrInvalid},
			{cmd: ConfigureQuota{Quota: "q", Burst: 10, Rate: 1, LeasePeriod: 0}, err: ErrInvalid},
			{cmd: ConfigureQuota{Quota: "q", Burst: 10, Rate: 1, LeasePeriod: MaxPeriod + 1}, err: ErrInvalid},
			{cmd: ConfigureQuota{Quota: "q", Burst: 10, Rate: 1, LeasePeriod: sec, SafetyMargin: -1}, err: ErrInvalid},
			{cmd: ConfigureQuota{Quota: "q", Burst: 10, Rate: 1, LeasePeriod: sec, MinSlice: 2, MaxSlice: 1}, err: ErrInvalid},
			{cmd: ConfigureQuota{Quota: "q", Burst: 10, Rate: 1, LeasePeriod: sec, MinSlice: nan}, err: ErrInvalid},
			{cmd: ConfigureQuota{Quota: "", Burst: 10, Rate: 1, LeasePeriod: sec}, err: ErrInvalid},
			{cmd: ConfigureQuota{Quota: "\xff", Burst: 10, Rate: 1, LeasePeriod: sec}, err: ErrInvalid},
			{cmd: ConfigureQuota{Now: -1, Quota: "q", Burst: 10, Rate: 1, LeasePeriod: sec}, err: ErrInvalid},
			{cmd: Tick{Now: 0}, want: []check{func(t *testing.T, s *State, _ Result) {
				if len(s.Quotas()) != 0 {
					t.Errorf("quotas %v exist after invalid configures", s.Quotas())
				}
			}}},
		}},
		{"lowering B below what is leased: pool absorbs, ceiling holds, leases shrink at renewal", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}, want: []check{wantGranted(1, 100, 100, 10, 10*sec)}},
			{cmd: ConfigureQuota{Quota: "q", Burst: 40, Rate: 4, LeasePeriod: 10 * sec, SafetyMargin: sec},
				want: []check{wantPool("q", 0), wantCeil("q", 100, 10), wantReserved("q", 100, 10)}},
			// The renewal answers the new sizes but the old ones stay
			// reserved until the holder confirms them.
			{cmd: renew1(sec, "a", 2, 1, 0, 100, 100, 10),
				want: []check{wantItem(0, nil, 0, 40, 4, 0), wantLeaseRes(1, 100, 10), wantCeil("q", 100, 10)}},
			{cmd: renew1(2*sec, "a", 3, 1, 60, 100, 40, 4),
				want: []check{wantItem(0, nil, 0, 40, 4, 0), wantLeaseRes(1, 40, 4), wantCeil("q", 40, 4), wantReserved("q", 40, 4)}},
		}},
		{"raising B adds room, not tokens: the pool refills into it", []step{
			{cmd: quotaSliced(0, 2)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 2}, want: []check{wantPool("q", 80)}}, // cap 20, rate 2
			{cmd: ConfigureQuota{Quota: "q", Burst: 200, Rate: 10, LeasePeriod: 10 * sec, SafetyMargin: sec, MaxSlice: 2},
				want: []check{wantPool("q", 80), wantCeil("q", 200, 10)}},
			{cmd: Tick{Now: 5 * sec}, want: []check{wantPool("q", 120)}}, // at 10 - 2
			{cmd: Release{Now: 5 * sec, Holder: "a", Seq: 2, LeaseID: 1}, want: []check{wantPool("q", 120)}},
			// Full at its new size, with no lease: idle, removed.
			{cmd: Tick{Now: 13*sec - 1}, want: []check{wantPool("q", 200-0.00001)}},
			{cmd: Tick{Now: 13 * sec}, want: []check{wantGone("q")}},
		}},
		{"a new shape for an idle quota starts it afresh, as if Tick had removed it", []step{
			{cmd: quotaQ(0)},
			{cmd: ConfigureQuota{Quota: "q", Burst: 200, Rate: 10, LeasePeriod: 10 * sec, SafetyMargin: sec},
				want: []check{wantPool("q", 200), wantCeil("q", 200, 10)}},
			{cmd: ConfigureQuota{Now: sec, Quota: "q", Burst: 50, Rate: 0, LeasePeriod: 10 * sec, SafetyMargin: sec},
				want: []check{wantPool("q", 50), wantCeil("q", 50, 0)}},
			{cmd: Grant{Now: sec, Holder: "a", Seq: 1, Quota: "q", Demand: 1, Config: &QuotaConfig{Burst: 70, Rate: 1, LeasePeriod: 10 * sec}},
				want: []check{wantGranted(1, 70, 70, 1, 11*sec), wantPool("q", 0)}},
		}},
		{"lowering r below what is leased stops the pool refilling", []step{
			{cmd: quotaSliced(0, 5)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 5}, want: []check{wantGranted(1, 50, 50, 5, 10*sec)}},
			{cmd: Release{Holder: "b", Seq: 1, LeaseID: 1}, err: ErrLeaseExpired},
			{cmd: ConfigureQuota{Quota: "q", Burst: 100, Rate: 2, LeasePeriod: 10 * sec, SafetyMargin: sec},
				want: []check{wantCeil("q", 100, 5), wantPool("q", 50)}},
		}},
		{"an older Now is clamped", []step{
			{cmd: quotaQ(10 * sec)},
			{cmd: Grant{Now: 5 * sec, Holder: "a", Seq: 1, Quota: "q", Demand: 100},
				want: []check{wantGranted(1, 100, 100, 10, 20*sec), wantNow(10 * sec)}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { run(t, tt.steps) })
	}
}

func TestGrant(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{"first holder gets its share and a full bucket", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100},
				want: []check{wantGranted(1, 100, 100, 10, 10*sec), wantPool("q", 0)}},
		}},
		{"a lone holder gets the whole quota whatever demand it measured", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 2},
				want: []check{wantGranted(1, 100, 100, 10, 10*sec), wantPool("q", 0), wantReserved("q", 100, 10)}},
		}},
		{"within MaxSlice, a small demand gets what it asks and the rest stays pooled", []step{
			{cmd: quotaSliced(0, 2)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 2},
				want: []check{wantGranted(1, 20, 20, 2, 10*sec), wantPool("q", 80), wantReserved("q", 20, 2)}},
		}},
		{"what the demands leave over is shared by weight", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 1}},
			{cmd: Grant{Holder: "b", Seq: 1, Quota: "q", Demand: 3}, want: []check{wantGranted(2, 0, 0, 0, 10*sec)}},
			// Demands 1 and 3 leave 6 over: shared equally on top, a's
			// target is 5, and b's. a shrinks (counted at its old
			// size until it confirms), then b takes what a freed.
			{cmd: renew1(0, "a", 2, 1, 0, 1, 100, 10), want: []check{wantItem(0, nil, 0, 50, 5, 0)}},
			{cmd: renew1(0, "a", 3, 1, 50, 1, 50, 5), want: []check{wantItem(0, nil, 0, 50, 5, 50)}},
			{cmd: Grant{Holder: "b", Seq: 2, Quota: "q", Demand: 3}, want: []check{wantGranted(2, 50, 50, 5, 10*sec)}},
		}},
		{"a StartEmpty quota (a hot key's promotion) hands out only what refills after it exists", []step{
			{cmd: func() ConfigureQuota { c := quotaQ(0); c.StartEmpty = true; return c }(),
				want: []check{wantPool("q", 0)}},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100},
				want: []check{wantGranted(1, 0, 100, 10, 10*sec), wantPool("q", 0)}},
			// 2s later the lease has refilled 20 at its rate; the pool is
			// still empty (the lease holds the whole rate).
			{cmd: renew1(2*sec, "a", 2, 1, 0, 100, 100, 10), want: []check{wantItem(0, nil, 0, 100, 10, 0), wantPool("q", 0)}},
		}},
		{"grant with empty pool and nothing free: an empty lease that registers demand", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}},
			{cmd: Grant{Holder: "b", Seq: 1, Quota: "q", Demand: 100},
				want: []check{wantGranted(2, 0, 0, 0, 10*sec), wantPool("q", 0), wantLeases("q", 2)}},
		}},
		{"grant with empty pool but free room: cap without tokens", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}}, // everything
			// The pool is empty, but the capacity a release frees is room.
			{cmd: Release{Holder: "a", Seq: 2, LeaseID: 1, Unused: 0}, want: []check{wantCredited(0), wantPool("q", 0)}},
			{cmd: Grant{Holder: "c", Seq: 1, Quota: "q", Demand: 2},
				want: []check{wantGranted(2, 0, 100, 10, 10*sec), wantPool("q", 0)}},
		}},
		{"MaxSlice is a ceiling, also on what the demands leave over", []step{
			{cmd: ConfigureQuota{Quota: "q", Burst: 100, Rate: 10, LeasePeriod: 10 * sec, MinSlice: 1, MaxSlice: 3}},
			{cmd: Grant{Holder: "idle", Seq: 1, Quota: "q", Demand: 0}, want: []check{wantGranted(1, 30, 30, 3, 10*sec)}},
			{cmd: Grant{Holder: "hot", Seq: 1, Quota: "q", Demand: 100}, want: []check{wantGranted(2, 30, 30, 3, 10*sec)}},
		}},
		{"MinSlice is a floor whatever the demand", []step{
			{cmd: ConfigureQuota{Quota: "q", Burst: 100, Rate: 10, LeasePeriod: 10 * sec, MinSlice: 1}},
			{cmd: Grant{Holder: "hot", Seq: 1, Quota: "q", Demand: 100}, want: []check{wantGranted(1, 100, 100, 10, 10*sec)}},
			{cmd: Grant{Holder: "idle", Seq: 1, Quota: "q", Demand: 0}, want: []check{wantGranted(2, 0, 0, 0, 10*sec)}},
			// hot's target is now 9: it shrinks and confirms, idle gets its floor.
			{cmd: renew1(0, "hot", 2, 1, 0, 100, 100, 10), want: []check{wantItem(0, nil, 0, 90, 9, 0)}},
			{cmd: renew1(0, "hot", 3, 1, 10, 100, 90, 9)},
			{cmd: Grant{Holder: "idle", Seq: 2, Quota: "q", Demand: 0}, want: []check{wantGranted(2, 10, 10, 1, 10*sec)}},
		}},
		{"weights split capacity in proportion", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 0},
				want: []check{wantGranted(1, 100, 100, 10, 10*sec)}}, // alone: everything
			{cmd: Grant{Holder: "b", Seq: 1, Quota: "q", Demand: 100, Weight: 3},
				want: []check{wantGranted(2, 0, 0, 0, 10*sec)}}, // a holds everything
			{cmd: Grant{Holder: "a", Seq: 2, Quota: "q", Demand: 100, Weight: 1},
				want: []check{wantGranted(1, 0, 25, 2.5, 10*sec)}}, // a shrinks to 1/4
			{cmd: renew1(0, "a", 3, 1, 75, 100, 25, 2.5), want: []check{wantItem(0, nil, 0, 25, 2.5, 75)}},
			{cmd: Grant{Holder: "b", Seq: 2, Quota: "q", Demand: 100, Weight: 3},
				want: []check{wantGranted(2, 75, 75, 7.5, 10*sec)}},
		}},
		{"granting again while live is a renewal of the same lease", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 2}},
			{cmd: Grant{Now: sec, Holder: "a", Seq: 2, Quota: "q", Demand: 4},
				want: []check{wantGranted(1, 0, 100, 10, 11*sec), wantLeases("q", 1), wantPool("q", 0)}},
		}},
		{"granting again after expiry gives a new id; the old one is dead", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 2}},
			{cmd: Grant{Now: 10*sec + 1, Holder: "a", Seq: 2, Quota: "q", Demand: 2},
				want: []check{wantGranted(2, 0, 100, 10, 20*sec+1), wantLeases("q", 1)}},
			{cmd: renew1(10*sec+2, "a", 3, 1, 0, 2, 20, 2), want: []check{wantItem(0, ErrLeaseExpired, 0, 0, 0, 0)}},
		}},
		{"unknown quota changes nothing", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "nope", Demand: 1}, err: ErrUnknownQuota},
			// The rejected seq 1 was not recorded: it is still usable.
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 1}, want: []check{wantReplayed(false)}},
		}},
		{"bad numbers change nothing", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: math.NaN()}, err: ErrInvalid},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: -1}, err: ErrInvalid},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: math.Inf(1)}, err: ErrInvalid},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 1, Weight: -1}, err: ErrInvalid},
			{cmd: Grant{Holder: "a", Seq: 0, Quota: "q", Demand: 1}, err: ErrInvalid},
			{cmd: Grant{Holder: "", Seq: 1, Quota: "q", Demand: 1}, err: ErrInvalid},
			{cmd: Grant{Now: MaxTime + 1, Holder: "a", Seq: 1, Quota: "q", Demand: 1}, err: ErrInvalid},
		}},
		{"retry of a grant gets the same lease, granted once", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 2}, want: []check{wantPool("q", 0)}},
			{cmd: Grant{Now: sec, Holder: "a", Seq: 1, Quota: "q", Demand: 2},
				want: []check{wantReplayed(true), wantGranted(1, 100, 100, 10, 10*sec), wantPool("q", 0), wantLeases("q", 1)}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { run(t, tt.steps) })
	}
}

func TestRenew(t *testing.T) {
	// shrinkSetup: a holds all of q (cap 100, rate 10); b arrives and gets an
	// empty lease; at 1s a's renewal answers half, a shrink.
	shrinkSetup := []step{
		{cmd: quotaQ(0)},
		{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}, want: []check{wantGranted(1, 100, 100, 10, 10*sec)}},
		{cmd: Grant{Holder: "b", Seq: 1, Quota: "q", Demand: 100}, want: []check{wantGranted(2, 0, 0, 0, 10*sec)}},
		{cmd: renew1(sec, "a", 2, 1, 0, 100, 100, 10), want: []check{
			wantItem(0, nil, 0, 50, 5, 0), wantLeaseRes(1, 100, 10), wantReserved("q", 100, 10)}},
	}
	with := func(steps ...step) []step { return append(append([]step{}, shrinkSetup...), steps...) }
	tests := []struct {
		name  string
		steps []step
	}{
		{"shrink is counted at the old size until confirmed", with(
			// b cannot grow: a may still spend at 100, 10.
			step{cmd: renew1(2*sec, "b", 2, 2, 0, 100, 0, 0), want: []check{wantItem(0, nil, 0, 0, 0, 0)}},
			// a confirms 50, 5 and gives back the 50 above its new cap.
			step{cmd: renew1(3*sec, "a", 3, 1, 50, 100, 50, 5), want: []check{
				wantItem(0, nil, 0, 50, 5, 50), wantLeaseRes(1, 50, 5), wantPool("q", 50)}},
			// Now b grows, and its bucket is filled from the pool.
			step{cmd: renew1(4*sec, "b", 3, 2, 0, 100, 0, 0), want: []check{
				wantItem(0, nil, 50, 50, 5, 0), wantPool("q", 0), wantReserved("q", 100, 10)}},
		)},
		{"a confirmation of anything but the latest answer confirms nothing", with(
			step{cmd: renew1(2*sec, "a", 3, 1, 0, 100, 100, 10), want: []check{wantLeaseRes(1, 100, 10)}},
			step{cmd: renew1(2*sec, "a", 4, 1, 0, 100, 50, 10), want: []check{wantLeaseRes(1, 100, 10)}},
		)},
		{"shrink reservation ends when the old term is over", with(
			// The old answer (given at 0) is reclaimable after 11s; the new
			// term (given at 1s) is not over before 12s.
			step{cmd: Tick{Now: 11 * sec}, want: []check{wantLeaseRes(1, 100, 10), wantReclaimed()}},
			step{cmd: Tick{Now: 11*sec + 1}, want: []check{wantLeaseRes(1, 50, 5), wantReclaimed(2)}},
		)},
		{"over-reported unused is credited only up to what the holder could have", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}},
			// a gives everything back but keeps its cap: no room, no credit.
			{cmd: renew1(0, "a", 2, 1, 100, 100, 100, 10), want: []check{wantItem(0, nil, 0, 100, 10, 0)}},
			{cmd: Grant{Holder: "b", Seq: 1, Quota: "q", Demand: 100}},
			{cmd: renew1(0, "a", 3, 1, 0, 100, 100, 10), want: []check{wantItem(0, nil, 0, 50, 5, 0)}},
			// a could hold nothing (no time has passed): 1000 credits 0,
			// although the confirmed shrink leaves room for 50.
			{cmd: renew1(0, "a", 4, 1, 1000, 100, 50, 5), want: []check{wantItem(0, nil, 0, 50, 5, 0), wantPool("q", 0)}},
			// After 1s at the (reserved) rate 5 it could hold 5: 5 is
			// credited, and the pool (5 refilled + 5 credited) tops it up.
			{cmd: renew1(sec, "a", 5, 1, 1000, 100, 50, 5), want: []check{wantItem(0, nil, 10, 50, 5, 5), wantPool("q", 0)}},
		}},
		{"duplicate renew replays the answer and does not credit twice", with(
			step{cmd: renew1(3*sec, "a", 3, 1, 50, 100, 50, 5), want: []check{wantItem(0, nil, 0, 50, 5, 50), wantPool("q", 50)}},
			step{cmd: renew1(4*sec, "a", 3, 1, 50, 100, 50, 5), want: []check{
				wantReplayed(true), wantItem(0, nil, 0, 50, 5, 50), wantPool("q", 50), wantNow(3 * sec)}},
		)},
		{"reordered seq is rejected", with(
			step{cmd: renew1(3*sec, "a", 5, 1, 50, 100, 50, 5), want: []check{wantPool("q", 50)}},
			step{cmd: renew1(3*sec, "a", 4, 1, 50, 100, 50, 5), err: ErrStale},
			step{cmd: Grant{Now: 3 * sec, Holder: "a", Seq: 5, Quota: "q", Demand: 1}, err: ErrStale}, // same seq, other command
		)},
		{"renew of expired, unknown, foreign or unknown-quota leases is answered per item", with(
			// A quota that does not exist (never created, or removed once
			// idle) has no live lease: the holder must grant again.
			step{cmd: ConfigureQuota{Quota: "other", Burst: 1, Rate: 1, LeasePeriod: sec}},
			step{cmd: Renew{Now: 2 * sec, Holder: "a", Seq: 3, Items: []RenewItem{
				{LeaseID: 99, Quota: "q"},
				{LeaseID: 2, Quota: "q"}, // b's
				{LeaseID: 3, Quota: "nope"},
				{LeaseID: 1, Quota: "q", Demand: 100, ConfirmedCap: 50, ConfirmedRate: 5},
			}}, want: []check{
				wantItem(0, ErrLeaseExpired, 0, 0, 0, 0),
				wantItem(1, ErrLeaseExpired, 0, 0, 0, 0),
				wantItem(2, ErrLeaseExpired, 0, 0, 0, 0),
				wantItem(3, nil, 0, 50, 5, 0),
			}},
			// A lease renewed under another quota's name is not that lease.
			step{cmd: Renew{Now: 2 * sec, Holder: "a", Seq: 4, Items: []RenewItem{{LeaseID: 1, Quota: "other"}}},
				want: []check{wantItem(0, ErrLeaseExpired, 0, 0, 0, 0), wantLeaseRes(1, 50, 5)}},
			// b's lease expired at 10s: its renewal fails and credits nothing.
			step{cmd: renew1(10*sec+1, "b", 2, 2, 50, 100, 0, 0), want: []check{wantItem(0, ErrLeaseExpired, 0, 0, 0, 0), wantPool("q", 0)}},
		)},
		{"malformed renew is rejected whole", with(
			step{cmd: Renew{Now: 2 * sec, Holder: "a", Seq: 3}, err: ErrInvalid},
			step{cmd: Renew{Now: 2 * sec, Holder: "a", Seq: 3, Items: []RenewItem{{LeaseID: 1, Quota: "q"}, {LeaseID: 1, Quota: "q"}}}, err: ErrInvalid},
			step{cmd: Renew{Now: 2 * sec, Holder: "a", Seq: 3, Items: []RenewItem{{LeaseID: 1, Quota: "q", Unused: math.NaN()}}}, err: ErrInvalid},
			step{cmd: Renew{Now: 2 * sec, Holder: "a", Seq: 3, Items: []RenewItem{{LeaseID: 1, Quota: "q", ConfirmedCap: -1}}}, err: ErrInvalid},
			step{cmd: Renew{Now: 2 * sec, Holder: "a", Seq: 3, Items: []RenewItem{{LeaseID: 0, Quota: "q"}}}, err: ErrInvalid},
		)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { run(t, tt.steps) })
	}
}

func TestRelease(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{"release credits unused and frees the reservation", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}},
			{cmd: Release{Now: 5 * sec, Holder: "a", Seq: 2, LeaseID: 1, Unused: 30},
				want: []check{wantCredited(30), wantPool("q", 30), wantLeases("q", 0), wantReserved("q", 0, 0)}},
		}},
		{"release credits at most the bound", []step{
			{cmd: quotaSliced(0, 5)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 5}}, // cap 50, balance 50, pool 50
			{cmd: renew1(0, "a", 2, 1, 20, 5, 50, 5), want: []check{wantItem(0, nil, 20, 50, 5, 0), wantPool("q", 30)}},
			{cmd: Release{Holder: "a", Seq: 3, LeaseID: 1, Unused: 1000}, want: []check{wantCredited(50), wantPool("q", 80)}},
		}},
		{"release after expiry credits nothing", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}},
			{cmd: Release{Now: 10*sec + 1, Holder: "a", Seq: 2, LeaseID: 1, Unused: 100},
				want: []check{wantCredited(0), wantPool("q", 0), wantLeases("q", 0)}},
		}},
		{"release at the last moment of the term still credits", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}},
			{cmd: Release{Now: 10 * sec, Holder: "a", Seq: 2, LeaseID: 1, Unused: 100}, want: []check{wantCredited(100)}},
		}},
		{"release of an unknown or foreign lease is answered, recorded, and replayed", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}},
			{cmd: Release{Holder: "b", Seq: 1, LeaseID: 1, Unused: 100}, err: ErrLeaseExpired, want: []check{wantLeases("q", 1)}},
			{cmd: Release{Holder: "b", Seq: 1, LeaseID: 1, Unused: 100}, err: ErrLeaseExpired, want: []check{wantReplayed(true)}},
			{cmd: Release{Holder: "a", Seq: 2, LeaseID: 7}, err: ErrLeaseExpired},
		}},
		{"duplicate release does not credit twice", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}},
			{cmd: Release{Now: sec, Holder: "a", Seq: 2, LeaseID: 1, Unused: 40}, want: []check{wantPool("q", 40)}},
			{cmd: Release{Now: sec, Holder: "a", Seq: 2, LeaseID: 1, Unused: 40}, want: []check{wantReplayed(true), wantCredited(40), wantPool("q", 40)}},
			{cmd: Release{Now: sec, Holder: "a", Seq: 1, LeaseID: 1, Unused: 40}, err: ErrStale},
		}},
		{"bad numbers change nothing", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}},
			{cmd: Release{Holder: "a", Seq: 2, LeaseID: 1, Unused: math.NaN()}, err: ErrInvalid},
			{cmd: Release{Holder: "a", Seq: 2, LeaseID: 1, Unused: -1}, err: ErrInvalid},
			{cmd: Release{Holder: "a", Seq: 2, LeaseID: 0}, err: ErrInvalid},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { run(t, tt.steps) })
	}
}

func TestTick(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{"expired lease is reclaimed only after the margin, its tokens lost", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}},
			{cmd: Tick{Now: 10*sec + 1}, want: []check{wantReclaimed(), wantLeases("q", 1)}},
			{cmd: Tick{Now: 11 * sec}, want: []check{wantReclaimed(), wantLeases("q", 1), wantPool("q", 0)}},
			{cmd: Tick{Now: 11*sec + 1}, want: []check{wantReclaimed(1), wantLeases("q", 0), wantPool("q", 0)}},
			{cmd: Tick{Now: 12*sec + 1}, want: []check{wantPool("q", 10)}},
		}},
		{"pool refills at r minus leased rates, up to B minus leased caps", []step{
			{cmd: quotaSliced(0, 2)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 2}},              // cap 20 rate 2, pool 80
			{cmd: Release{Holder: "b", Seq: 1, LeaseID: 9}, err: ErrLeaseExpired}, // a no-op answer
			{cmd: renew1(0, "a", 2, 1, 0, 2, 20, 2)},
			{cmd: Grant{Holder: "b", Seq: 2, Quota: "q", Demand: 1, Bounds: &Bounds{MaxSlice: 1}}}, // cap 10, balance 10, pool 70
			{cmd: Tick{Now: sec}, want: []check{wantPool("q", 70)}},                                // full: room 70
			{cmd: Release{Now: sec, Holder: "b", Seq: 3, LeaseID: 2, Unused: 0}, want: []check{wantPool("q", 70)}},
			{cmd: Tick{Now: 2 * sec}, want: []check{wantPool("q", 78)}}, // 10 - 2 per second
			{cmd: Tick{Now: 3 * sec}, want: []check{wantPool("q", 80)}}, // room 80
		}},
		{"time never goes back", []step{
			{cmd: quotaQ(0)},
			{cmd: Tick{Now: 5 * sec}, want: []check{wantNow(5 * sec)}},
			{cmd: Tick{Now: 3 * sec}, want: []check{wantNow(5 * sec)}},
		}},
		{"a holder's record is kept while it leases, then for RecordTTL", []step{
			{cmd: ConfigureQuota{Quota: "q", Burst: 10, Rate: 1, LeasePeriod: 2 * RecordTTL}},
			{cmd: Grant{Holder: "a", Seq: 5, Quota: "q", Demand: 1}},
			{cmd: Tick{Now: RecordTTL + 1}, want: []check{wantLeases("q", 1)}},
			{cmd: Grant{Now: RecordTTL + 1, Holder: "a", Seq: 5, Quota: "q", Demand: 1}, want: []check{wantReplayed(true)}},
			{cmd: Release{Now: RecordTTL + 2, Holder: "a", Seq: 6, LeaseID: 1}, want: []check{wantLeases("q", 0)}},
			{cmd: Tick{Now: 2*RecordTTL + 2}},
			{cmd: Grant{Now: 2*RecordTTL + 2, Holder: "a", Seq: 4, Quota: "q", Demand: 1}, err: ErrStale},
			{cmd: Tick{Now: 2*RecordTTL + 3}},
			// The quota went idle long ago: the grant recreates it.
			{cmd: Grant{Now: 2*RecordTTL + 3, Holder: "a", Seq: 4, Quota: "q", Demand: 1, Config: &QuotaConfig{Burst: 10, Rate: 1, LeasePeriod: 2 * RecordTTL}},
				want: []check{wantReplayed(false), wantLeases("q", 1)}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { run(t, tt.steps) })
	}
}

func TestLeaderElected(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{"extends reclaim time to now + term + margin", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}, want: []check{wantReclaimAt(1, 11*sec)}},
			{cmd: LeaderElected{Now: 5 * sec}, want: []check{wantReclaimAt(1, 16*sec)}},
			{cmd: Tick{Now: 16 * sec}, want: []check{wantReclaimed()}},
			{cmd: Tick{Now: 16*sec + 1}, want: []check{wantReclaimed(1)}},
		}},
		{"never shortens a reclaim time", []step{
			{cmd: quotaQ(20 * sec)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}, want: []check{wantReclaimAt(1, 31*sec)}},
			{cmd: LeaderElected{Now: 0}, want: []check{wantReclaimAt(1, 31*sec), wantNow(20 * sec)}},
		}},
		{"extends a pending shrink reservation", []step{
			{cmd: quotaQ(0)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 100}},
			{cmd: Grant{Holder: "b", Seq: 1, Quota: "q", Demand: 100}},
			{cmd: renew1(sec, "a", 2, 1, 0, 100, 100, 10), want: []check{wantLeaseRes(1, 100, 10), wantResUntil(1, 11*sec)}},
			{cmd: LeaderElected{Now: 10 * sec}, want: []check{wantResUntil(1, 21*sec), wantReclaimAt(1, 21*sec)}},
			// Without the election the reservation would end after 11s.
			{cmd: Tick{Now: 11*sec + 1}, want: []check{wantLeaseRes(1, 100, 10)}},
		}},
		{"the pools do not refill over the jump to a new leader's clock", []step{
			{cmd: quotaSliced(0, 5)},
			{cmd: Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 5}},
			{cmd: Release{Holder: "a", Seq: 2, LeaseID: 1}, want: []check{wantPool("q", 50)}},
			{cmd: Tick{Now: sec}, want: []check{wantPool("q", 60)}},
			{cmd: LeaderElected{Now: 100 * sec}, want: []check{wantPool("q", 60)}},
			{cmd: Tick{Now: 101 * sec}, want: []check{wantPool("q", 70)}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { run(t, tt.steps) })
	}
}

func TestApplyUnknownCommand(t *testing.T) {
	tests := []struct {
		name string
		cmd  Command
		want error
	}{
		{"nil", nil, ErrUnknownCommand},
		{"typed nil pointer", (*Grant)(nil), ErrUnknownCommand},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New()
			if _, err := s.Apply(tt.cmd); !errors.Is(err, tt.want) {
				t.Errorf("Apply(%v) = %v, want %v", tt.cmd, err, tt.want)
			}
		})
	}
}

func TestApplyPointerCommands(t *testing.T) {
	s := New()
	if _, err := s.Apply(&ConfigureQuota{Quota: "q", Burst: 1, Rate: 1, LeasePeriod: sec}); err != nil {
		t.Fatalf("Apply(&ConfigureQuota) = %v", err)
	}
	r, err := s.Apply(&Grant{Holder: "a", Seq: 1, Quota: "q", Demand: 1})
	if err != nil || r.Lease == nil {
		t.Fatalf("Apply(&Grant) = %+v, %v", r, err)
	}
}
