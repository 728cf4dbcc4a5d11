package lease

import (
	"bytes"
	"math"
	"reflect"
	"testing"
)

// quotaF is a funded quota whose own part (a region's safe share) is
// (10, 1): D=10s, margin 1s.
func quotaF(now int64) ConfigureQuota {
	return ConfigureQuota{Now: now, Quota: "f", Burst: 10, Rate: 1, LeasePeriod: 10 * sec, SafetyMargin: sec, Funded: true}
}

func wantFund(quota string, f Funding) check {
	return func(t *testing.T, s *State, _ Result) {
		t.Helper()
		q, _ := s.Quota(quota)
		if q.Fund != f {
			t.Errorf("funding of %q = %+v, want %+v", quota, q.Fund, f)
		}
	}
}

func wantEffective(quota string, burst, rate float64) check {
	return func(t *testing.T, s *State, _ Result) {
		t.Helper()
		q, _ := s.Quota(quota)
		if e := q.Effective(); !near(e.Burst, burst) || !near(e.Rate, rate) {
			t.Errorf("effective shape of %q = (%v, %v), want (%v, %v)", quota, e.Burst, e.Rate, burst, rate)
		}
	}
}

func TestFund(t *testing.T) {
	fund := func(now int64, burst, rate, deposit float64, notAfter int64) Fund {
		return Fund{Now: now, Quota: "f", Burst: burst, Rate: rate, Deposit: deposit, NotAfter: notAfter}
	}
	run(t, []step{
		{cmd: fund(0, 1, 1, 0, sec), err: ErrUnknownQuota},
		{cmd: quotaQ(0)},
		{cmd: Fund{Quota: "q", Burst: 1, NotAfter: sec}, err: ErrInvalid}, // not funded
		{cmd: Fund{Quota: "q", Burst: math.NaN()}, err: ErrInvalid},
		{cmd: ConfigureQuota{Quota: "z", LeasePeriod: sec}, err: ErrInvalid}, // burst 0, not funded
		{cmd: ConfigureQuota{Quota: "z", LeasePeriod: sec, Funded: true}},    // a region with no safe share
		// Own part (10, 1), pool starts at its own burst.
		{cmd: quotaF(0), want: []check{wantPool("f", 10), wantEffective("f", 10, 1)}},
		// The upstream lease: cap 90, rate 9, 50 tokens moved, valid until 6s.
		{cmd: fund(0, 90, 9, 50, 6*sec), want: []check{
			wantPool("f", 60), wantEffective("f", 100, 10), wantFund("f", Funding{90, 9, 6 * sec}),
		}},
		// A sublease's term ends with the parent's validity, not at 1s+D.
		{cmd: Grant{Now: sec, Holder: "a", Seq: 1, Quota: "f", Demand: 10},
			want: []check{wantGranted(1, 70, 100, 10, 6*sec)}},
		// The upstream lease shrinks to nothing: nothing is revoked, the
		// quota is held to what is reserved until the sublease ends.
		{cmd: fund(2*sec, 0, 0, 0, 0), want: []check{
			wantFund("f", Funding{}), wantEffective("f", 10, 1), wantCeil("f", 100, 10), wantPool("f", 0),
		}},
		{cmd: Grant{Now: 3 * sec, Holder: "b", Seq: 1, Quota: "f", Demand: 10},
			want: []check{wantGranted(2, 0, 0, 0, 13*sec)}},
		// a is reclaimed after 6s + margin; the quota is back to its own part.
		{cmd: Tick{Now: 8 * sec}, want: []check{wantReclaimed(1), wantCeil("f", 10, 1)}},
		// Funded again until 12s; the first command after 12s drops it by
		// itself, refilling under it only up to 12s.
		{cmd: fund(9*sec, 90, 9, 0, 12*sec), want: []check{wantEffective("f", 100, 10)}},
		{cmd: Tick{Now: 13 * sec}, want: []check{wantFund("f", Funding{}), wantEffective("f", 10, 1)}},
		{cmd: fund(14*sec, 90, 9, 5, 20*sec), want: []check{wantEffective("f", 100, 10)}},
		// A new leader does not trust the old one's NotAfter.
		{cmd: LeaderElected{Now: 15 * sec}, want: []check{wantFund("f", Funding{}), wantEffective("f", 10, 1)}},
		// A funding whose end has passed is no funding.
		{cmd: fund(16*sec, 90, 9, 5, 16*sec), want: []check{wantFund("f", Funding{}), wantEffective("f", 10, 1)}},
	})
}

// A funded quota's pool never takes more of a deposit than its room.
func TestFundDepositWithinRoom(t *testing.T) {
	run(t, []step{
		{cmd: quotaF(0)},
		{cmd: Fund{Quota: "f", Burst: 20, Rate: 2, Deposit: 1000, NotAfter: 10 * sec}, want: []check{wantPool("f", 30)}},
	})
}

func TestFundEncoding(t *testing.T) {
	f := Fund{Now: 5, Quota: "r|s", Burst: 1.5, Rate: 2, Deposit: 3, NotAfter: 99}
	b, err := EncodeCommand(f)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeCommand(b)
	if err != nil || !reflect.DeepEqual(got, f) {
		t.Fatalf("DecodeCommand(EncodeCommand(%+v)) = %+v, %v", f, got, err)
	}
	// A funded quota's snapshot keeps its own part and its funding.
	s := New()
	for _, c := range []Command{quotaF(0), quotaQ(0), Fund{Now: 1, Quota: "f", Burst: 5, Rate: 5, Deposit: 2, NotAfter: 10 * sec}} {
		if _, err := s.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	r := New()
	if err := r.UnmarshalBinary(snap); err != nil {
		t.Fatalf("UnmarshalBinary: %v", err)
	}
	again, _ := r.MarshalBinary()
	if !bytes.Equal(snap, again) {
		t.Fatalf("snapshot round trip differs:\n%s\n%s", snap, again)
	}
	if q, _ := r.Quota("f"); q.Fund.Burst != 5 || q.Burst != 10 || !q.Funded {
		t.Fatalf("restored funded quota = %+v", q)
	}
	if !bytes.Contains(snap, []byte(`"name":"q","config":{"burst":100,"rate":10,"lease_period":10000000,"min_slice":0,"max_slice":0,"safety_margin":1000000},"pool":100,"pool_at":0,"ceil_burst":100,"ceil_rate":10,"leases":[]}`)) {
		t.Errorf("an unfunded quota's snapshot record changed form: %s", snap)
	}
}

// An upstream answer is deposited once: a Fund numbered below one already
// applied is stale and changes nothing (a new regional leader answered an
// earlier leader's recorded answer again must not deposit it twice), one
// with the same number applies (a round's renewals share one number), and
// a Fund of an older log (Seq 0) always applies. The number is the
// state's, not a quota's (a quota removed when idle does not take it
// along), and survives a snapshot.
func TestFundSeqDepositsOnce(t *testing.T) {
	fund := func(now int64, seq uint64, deposit float64) Fund {
		return Fund{Now: now, Quota: "f", Burst: 90, Rate: 9, Deposit: deposit, NotAfter: 6 * sec, Seq: seq}
	}
	wantUp := func(seq uint64) check {
		return func(t *testing.T, s *State, _ Result) {
			t.Helper()
			if got := s.UpstreamSeq(); got != seq {
				t.Errorf("UpstreamSeq = %d, want %d", got, seq)
			}
		}
	}
	s, _ := run(t, []step{
		{cmd: quotaF(0)},
		{cmd: Grant{Now: 0, Holder: "a", Seq: 1, Quota: "f", Demand: 10}}, // takes the own 10
		{cmd: fund(0, 100, 50), want: []check{wantPool("f", 50), wantUp(100)}},
		{cmd: fund(0, 99, 50), err: ErrStale},                                    // replayed answer: nothing deposited
		{cmd: fund(0, 100, 10), want: []check{wantPool("f", 60), wantUp(100)}},   // same round, another item
		{cmd: fund(0, 0, 10), want: []check{wantPool("f", 70), wantUp(100)}},     // an older log's Fund
		{cmd: fund(0, 101, 0), want: []check{wantPool("f", 70), wantUp(101)}},    // the next round
		{cmd: Fund{Now: 0, Quota: "nope", Seq: 5, NotAfter: sec}, err: ErrStale}, // stale before unknown
	})
	snap, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	r := New()
	if err := r.UnmarshalBinary(snap); err != nil {
		t.Fatalf("UnmarshalBinary: %v", err)
	}
	if r.UpstreamSeq() != 101 || !bytes.Contains(snap, []byte(`"version":4`)) {
		t.Fatalf("restored UpstreamSeq = %d (snapshot %s), want 101 at version 4", r.UpstreamSeq(), snap)
	}
	f := fund(7, 101, 1)
	b, err := EncodeCommand(f)
	if err != nil {
		t.Fatal(err)
	}
	if b[1] != 5 {
		t.Errorf("a Fund with Seq is encoded at version %d, want 5", b[1])
	}
	if got, err := DecodeCommand(b); err != nil || !reflect.DeepEqual(got, f) {
		t.Fatalf("DecodeCommand(EncodeCommand(%+v)) = %+v, %v", f, got, err)
	}
	if b, _ := EncodeCommand(fund(7, 0, 1)); b[1] != 1 {
		t.Errorf("a Fund without Seq is encoded at version %d, want 1 (as before)", b[1])
	}
}
