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
