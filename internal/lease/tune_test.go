package lease

import (
	"errors"
	"strings"
	"testing"
)

func ptr(v float64) *float64 { return &v }

func TestTune(t *testing.T) {
	s := New()
	apply := func(c Command) error { _, err := s.Apply(c); return err }
	if err := apply(Tune{Tuning: Tuning{Rule: "g", Weight: 2, LeasePeriod: 5 * sec}}); err != nil {
		t.Fatal(err)
	}
	if err := apply(Tune{Tuning: Tuning{Rule: "g", Region: "eu", MinSlice: ptr(0), MaxSlice: ptr(30), RenewAt: 0.25}}); err != nil {
		t.Fatal(err)
	}
	got, ok := s.Tuning("g", "eu")
	if !ok || got.Weight != 2 || got.LeasePeriod != 5*sec || *got.MaxSlice != 30 || *got.MinSlice != 0 || got.RenewAt != 0.25 {
		t.Fatalf("Tuning(g, eu) = %+v, %v; want eu's over the default", got, ok)
	}
	if got, _ := s.Tuning("g", "us"); got.Weight != 2 || got.MaxSlice != nil {
		t.Fatalf("Tuning(g, us) = %+v, want the default only", got)
	}
	// A bad tuning reports every problem, naming fields, and changes nothing.
	before, _ := s.MarshalBinary()
	err := apply(Tune{Tuning: Tuning{Rule: "g", Region: "eu", RenewAt: 1.5, Weight: -1, MinSlice: ptr(5), MaxSlice: ptr(1), LeasePeriod: -3}})
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad Tune = %v, want ErrInvalid", err)
	}
	for _, f := range []string{"renew_at 1.5", "weight -1", "max_slice 1 < min_slice 5", "lease_period -3"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error %q does not name %q", err, f)
		}
	}
	if err := apply(Tune{Tuning: Tuning{Rule: "g"}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty Tune = %v, want ErrInvalid", err)
	}
	after, _ := s.MarshalBinary()
	if string(before) != string(after) {
		t.Fatal("a refused Tune changed the state")
	}
	// Tunings survive a snapshot.
	r := New()
	if err := r.UnmarshalBinary(after); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Tuning("g", "eu"); got.Weight != 2 || *got.MaxSlice != 30 {
		t.Fatalf("restored Tuning(g, eu) = %+v", got)
	}
	if err := apply(Tune{Tuning: Tuning{Rule: "g", Region: "eu"}, Clear: true}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Tuning("g", "eu"); got.MaxSlice != nil {
		t.Fatalf("after clear, Tuning(g, eu) = %+v", got)
	}
}

// Per-lease bounds replace the quota's: a tuned region's lease gets its own
// period and slice cap.
func TestLeaseBounds(t *testing.T) {
	run(t, []step{
		{cmd: quotaQ(0)},
		{cmd: Grant{Now: 0, Holder: "a", Seq: 1, Quota: "q", Demand: 10, Bounds: &Bounds{Period: 2 * sec, MaxSlice: 4}},
			want: []check{wantGranted(1, 40, 40, 4, 2*sec)}},
		{cmd: Grant{Now: 0, Holder: "b", Seq: 1, Quota: "q", Demand: 10, Bounds: &Bounds{MinSlice: 5, MaxSlice: 1}}, err: ErrInvalid},
	})
}

// A safe share changes in two phases: the Tune records the value it
// replaces (pending: counted max, allowed min), a settle for the current
// target clears it, other Tunes and Clear keep it, and a second change is
// refused while one is pending.
func TestTuneSafeShare(t *testing.T) {
	s := New()
	apply := func(c Command) error { _, err := s.Apply(c); return err }
	get := func() Tuning { tu, _ := s.Tuning("g", "eu"); return tu }
	// Raise 10 (the file's) -> 20: counted 20, allowed 10 until settled.
	if err := apply(Tune{Tuning: Tuning{Rule: "g", Region: "eu", SafeShare: ptr(20), SafePrev: ptr(10)}}); err != nil {
		t.Fatal(err)
	}
	c, _ := get().Counted()
	a, _ := get().Allowed()
	if !get().Pending() || c != 20 || a != 10 {
		t.Fatalf("pending raise: %+v counted %v allowed %v, want 20 and 10", get(), c, a)
	}
	// Another knob, and a clear, keep the safe share and its pending state.
	if err := apply(Tune{Tuning: Tuning{Rule: "g", Region: "eu", Weight: 3}}); err != nil {
		t.Fatal(err)
	}
	if err := apply(Tune{Tuning: Tuning{Rule: "g", Region: "eu"}, Clear: true}); err != nil {
		t.Fatal(err)
	}
	if g := get(); !g.Pending() || *g.SafeShare != 20 || g.Weight != 0 {
		t.Fatalf("after weight and clear: %+v, want safe share 20 pending from 10, no weight", g)
	}
	// A second change while pending is refused and changes nothing.
	before, _ := s.MarshalBinary()
	if err := apply(Tune{Tuning: Tuning{Rule: "g", Region: "eu", SafeShare: ptr(5), SafePrev: ptr(10)}}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "safe_share") {
		t.Fatalf("change while pending = %v, want ErrInvalid naming safe_share", err)
	}
	// A settle for another value does nothing.
	if err := apply(Tune{Tuning: Tuning{Rule: "g", Region: "eu", SafeShare: ptr(5)}, Safe: SafeSettle}); err != nil {
		t.Fatal(err)
	}
	if after, _ := s.MarshalBinary(); string(before) != string(after) {
		t.Fatal("a refused change or a settle for another value changed the state")
	}
	if err := apply(Tune{Tuning: Tuning{Rule: "g", Region: "eu", SafeShare: ptr(20)}, Safe: SafeSettle}); err != nil {
		t.Fatal(err)
	}
	if g := get(); g.Pending() || *g.SafeShare != 20 {
		t.Fatalf("settled: %+v", g)
	}
	// The next change replaces the record's value, not the file's.
	if err := apply(Tune{Tuning: Tuning{Rule: "g", Region: "eu", SafeShare: ptr(5), SafePrev: ptr(10)}}); err != nil {
		t.Fatal(err)
	}
	c, _ = get().Counted()
	a, _ = get().Allowed()
	if c != 20 || a != 5 {
		t.Fatalf("pending lowering 20 -> 5: counted %v allowed %v", c, a)
	}
	// Snapshots keep it.
	snap, _ := s.MarshalBinary()
	r := New()
	if err := r.UnmarshalBinary(snap); err != nil {
		t.Fatal(err)
	}
	if g, _ := r.Tuning("g", "eu"); !g.Pending() || *g.SafeShare != 5 || *g.SafePrev != 20 {
		t.Fatalf("restored: %+v", g)
	}
	// A region learns a value: set, never pending.
	if err := apply(Tune{Tuning: Tuning{Rule: "g", Region: "us", SafeShare: ptr(7)}, Safe: SafeLearn}); err != nil {
		t.Fatal(err)
	}
	if g, _ := s.Tuning("g", "us"); g.Pending() || *g.SafeShare != 7 {
		t.Fatalf("learned: %+v", g)
	}
	// Bad safe-share commands are refused, naming fields.
	for _, c := range []Tune{
		{Tuning: Tuning{Rule: "g", SafeShare: ptr(1)}},
		{Tuning: Tuning{Rule: "g", Region: "eu", SafeShare: ptr(-1)}},
		{Tuning: Tuning{Rule: "g", Region: "eu", Weight: 1}, Safe: SafeSettle},
		{Tuning: Tuning{Rule: "g", Region: "eu", SafeShare: ptr(1)}, Safe: "bogus"},
	} {
		if err := apply(c); !errors.Is(err, ErrInvalid) || !(strings.Contains(err.Error(), "safe")) {
			t.Errorf("%+v = %v, want ErrInvalid naming the safe share", c, err)
		}
	}
}
