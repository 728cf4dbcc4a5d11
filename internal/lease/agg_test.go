package lease

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestTargetsMatchFullShare checks the targets read off the aggregates
// against the full water-filling (share) on random quotas: floors, maxima,
// per-lease bounds, weights, demands below and above the rate, expired
// leases, a rate of 0, and renewals in between that move the aggregates.
func TestTargetsMatchFullShare(t *testing.T) {
	checked, stages := 0, map[int]int{}
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 15))
		s := New()
		cfg := ConfigureQuota{Quota: "q", Burst: 1 + rng.Float64()*1e4, Rate: rng.Float64() * 1e3,
			LeasePeriod: sec * int64(1+rng.IntN(10)), SafetyMargin: sec}
		if rng.IntN(8) == 0 {
			cfg.Rate = 0
		}
		n := 1 + rng.IntN(60)
		if rng.IntN(2) == 0 {
			cfg.MinSlice = cfg.Rate / float64(n) * rng.Float64()
		}
		if rng.IntN(2) == 0 {
			cfg.MaxSlice = cfg.MinSlice + rng.Float64()*cfg.Rate
		}
		if _, err := s.Apply(cfg); err != nil {
			t.Fatal(seed, err)
		}
		seqs := map[string]uint64{}
		var now int64
		grant := func(h string) {
			seqs[h]++
			g := Grant{Now: now, Holder: h, Seq: seqs[h], Quota: "q", Demand: rng.Float64() * 3 * cfg.Rate / float64(n)}
			if rng.IntN(3) == 0 {
				g.Weight = math.Exp(rng.Float64()*6 - 3)
			}
			if rng.IntN(5) == 0 {
				g.Bounds = &Bounds{MinSlice: rng.Float64() * cfg.Rate / float64(n), MaxSlice: cfg.Rate * rng.Float64()}
				g.Bounds.MaxSlice = max(g.Bounds.MaxSlice, g.Bounds.MinSlice)
			}
			if rng.IntN(10) == 0 {
				g.Demand = 0
			}
			if _, err := s.Apply(g); err != nil {
				t.Fatal(seed, err)
			}
		}
		for step := range 3 * n {
			now += int64(rng.IntN(int(sec)))
			grant(fmt.Sprintf("h%d", rng.IntN(n)))
			q := s.quotas["q"]
			if q == nil {
				continue
			}
			q.purge(s.now)
			fast := q.compute()
			if fast.slow != nil {
				continue // the floors do not fit: the full computation is used
			}
			full := q.share(s.now, nil)
			stages[fast.rate.stage]++
			for i, l := range q.leases {
				if s.now > l.Expiry {
					continue
				}
				checked++
				got, want := fast.ofAt(i, l), full[i]
				if !near(got.rate, want.rate) && math.Abs(got.rate-want.rate) > 1e-9*cfg.Rate ||
					!near(got.cap, want.cap) && math.Abs(got.cap-want.cap) > 1e-9*cfg.Burst {
					t.Fatalf("seed %d step %d lease %d (%+v): target %+v, full share %+v", seed, step, l.ID, l.lim, got, want)
				}
			}
		}
	}
	if checked < 10000 || stages[fillB] == 0 || stages[fillC] == 0 || stages[fillAll] == 0 || stages[fillZero] == 0 {
		t.Fatalf("checked %d targets, water-fillings by stage %v: the random quotas miss a case", checked, stages)
	}
	t.Logf("checked %d targets, water-fillings by stage %v", checked, stages)
}
