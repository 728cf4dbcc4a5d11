package region

import (
	"math"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		id ID
		ok bool
	}{
		{"eu", true}, {"us-east_1", true}, {"0a", true},
		{"", false}, {"-eu", false}, {"EU", false}, {"eu/1", false}, {"a23456789012345678901234567890123", false},
	} {
		if got := tc.id.Check() == ""; got != tc.ok {
			t.Errorf("ID(%q).Check() = %q, want ok %v", tc.id, tc.id.Check(), tc.ok)
		}
	}
}

func TestEnforce(t *testing.T) {
	for _, tc := range []struct {
		s      Scope
		leased bool
		want   Enforcement
	}{
		{ScopeRegion, false, Local}, {ScopeRegion, true, Local},
		{ScopeGlobal, false, Split}, {ScopeGlobal, true, Hierarchical},
	} {
		if got := Enforce(tc.s, tc.leased); got != tc.want {
			t.Errorf("Enforce(%v, %v) = %v, want %v", tc.s, tc.leased, got, tc.want)
		}
	}
}

func TestSplits(t *testing.T) {
	got := Splits(300, 30, map[ID]Weight{"eu": {Weight: 2}, "us": {Weight: 1}})
	if !near(got["eu"].Burst, 200) || !near(got["eu"].Rate, 20) || !near(got["us"].Burst, 100) || !near(got["us"].Rate, 10) {
		t.Fatalf("Splits(300, 30, eu:2 us:1) = %v, want eu (200, 20), us (100, 10)", got)
	}
	var sb, sr float64
	ws := map[ID]Weight{"a": {Weight: 0.3}, "b": {Weight: 7}, "c": {Weight: 1e-3}}
	for _, s := range Splits(1000, 77, ws) {
		sb += s.Burst
		sr += s.Rate
	}
	if sb > 1000*(1+1e-12) || sr > 77*(1+1e-12) {
		t.Fatalf("Splits sum to (%v, %v), above (1000, 77)", sb, sr)
	}
}

func TestSafeAndOvershoot(t *testing.T) {
	ws := map[ID]Weight{"eu": {Weight: 2, SafeShare: 10}, "us": {Weight: 1, SafeShare: 5}}
	if got := SafeTotal(100, 20, ws); !near(got.Burst, 75) || !near(got.Rate, 15) {
		t.Errorf("SafeTotal(100, 20) = %v, want (75, 15)", got)
	}
	if got := Overshoot(100, 20, ws); got != (Share{}) {
		t.Errorf("Overshoot(100, 20) = %v, want 0 (sum safe 15 <= 20)", got)
	}
	if got := Leasable(100, 20, ws); !near(got.Burst, 25) || !near(got.Rate, 5) {
		t.Errorf("Leasable(100, 20) = %v, want (25, 5)", got)
	}
	// sum(safe) = 15 > r = 10: safe bursts 100 (capped at B) + 50.
	if got := Overshoot(100, 10, ws); !near(got.Rate, 5) || !near(got.Burst, 50) {
		t.Errorf("Overshoot(100, 10) = %v, want (50, 5)", got)
	}
	if got := Leasable(100, 10, ws); got != (Share{}) {
		t.Errorf("Leasable(100, 10) = %v, want 0", got)
	}
	if got := Safe(100, 0, 5); got != (Share{}) {
		t.Errorf("Safe(100, 0, 5) = %v, want 0: a rule that never refills has no safe share", got)
	}
}

func TestHolderName(t *testing.T) {
	id, ok := FromHolder(HolderName("eu"))
	if !ok || id != "eu" {
		t.Fatalf("FromHolder(HolderName(eu)) = %q, %v", id, ok)
	}
	if _, ok := FromHolder("agent-1"); ok {
		t.Fatal("FromHolder(agent-1) ok, want not a region")
	}
}
