package main

import (
	"math"
	"math/rand/v2"
	"testing"
)

const samples = 200000

func draw(t *testing.T, d keyDist, keys int) []int {
	t.Helper()
	counts := make([]int, keys)
	for range samples {
		k := d.next()
		if k < 0 || k >= keys {
			t.Fatalf("next() = %d, want in [0, %d)", k, keys)
		}
		counts[k]++
	}
	return counts
}

func TestUniformIsFlat(t *testing.T) {
	const keys = 20
	counts := draw(t, newKeyDist(distUniform, keys, 1.1, rand.New(rand.NewPCG(1, 2))), keys)
	want := float64(samples) / keys
	for k, c := range counts {
		// 5 standard deviations of a binomial count: fails by chance ~never.
		if math.Abs(float64(c)-want) > 5*math.Sqrt(want) {
			t.Errorf("key %d drawn %d times, want %.0f ± %.0f", k, c, want, 5*math.Sqrt(want))
		}
	}
}

func TestZipfShape(t *testing.T) {
	for _, s := range []float64{1.1, 2} {
		const keys = 1000
		counts := draw(t, newKeyDist(distZipf, keys, s, rand.New(rand.NewPCG(3, 4))), keys)
		// P(k) ∝ (k+1)^-s, so count(k)/count(2k+1) ≈ 2^s for the hot keys.
		for _, k := range []int{0, 1, 2} {
			got := float64(counts[k]) / float64(counts[2*k+1])
			if want := math.Pow(2, s); math.Abs(got-want)/want > 0.1 {
				t.Errorf("s=%g: count(%d)/count(%d) = %.2f, want %.2f ± 10%%", s, k, 2*k+1, got, want)
			}
		}
		// The head dominates: key 0 alone is more than all of the last half.
		tail := 0
		for _, c := range counts[keys/2:] {
			tail += c
		}
		if s == 2 && counts[0] <= tail {
			t.Errorf("s=%g: key 0 drawn %d times, last half %d: want a heavier head", s, counts[0], tail)
		}
		if counts[keys-1] > counts[0]/10 {
			t.Errorf("s=%g: last key drawn %d times, first %d: not skewed", s, counts[keys-1], counts[0])
		}
	}
}

func TestHotIsOneKey(t *testing.T) {
	counts := draw(t, newKeyDist(distHot, 5, 1.1, nil), 5)
	if counts[0] != samples {
		t.Errorf("hot: key 0 drawn %d of %d times, want every time", counts[0], samples)
	}
}

func TestRulePickerWeights(t *testing.T) {
	p := newRulePicker([]weightedRule{{"a", 3}, {"b", 1}, {"c", 0.5}}, rand.New(rand.NewPCG(5, 6)))
	counts := map[string]int{}
	for range samples {
		counts[p.next()]++
	}
	for name, w := range map[string]float64{"a": 3 / 4.5, "b": 1 / 4.5, "c": 0.5 / 4.5} {
		got := float64(counts[name]) / samples
		if math.Abs(got-w) > 0.01 {
			t.Errorf("rule %s picked %.3f of the time, want %.3f", name, got, w)
		}
	}
	if len(counts) != 3 {
		t.Errorf("picked %v, want only a, b, c", counts)
	}
}

func TestRequestGen(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Keys, cfg.Dist = 1, distUniform
	cfg.Descriptors = map[string]string{"endpoint": "search"}
	r := newRequestGen(cfg, 0).next()
	if r.Rule != "" || r.Subject != "" || r.Descriptors["user"] != "k0" || r.Descriptors["endpoint"] != "search" || len(r.Descriptors) != 2 {
		t.Errorf("descriptor request = %v, want descriptors user=k0, endpoint=search only", r)
	}
	if r.Cost != 0 {
		t.Errorf("cost = %v, want 0 (the agent's default of 1)", r.Cost)
	}

	cfg = DefaultConfig()
	cfg.Keys, cfg.Rule, cfg.Cost, cfg.KeyPrefix = 1, "per-user", 2, "s"
	r = newRequestGen(cfg, 0).next()
	if r.Rule != "per-user" || r.Subject != "s0" || r.Descriptors != nil || r.Cost != 2 {
		t.Errorf("rule request = %v, want rule per-user, subject s0, cost 2, no descriptors", r)
	}
}

// Workers draw different sequences; the same seed and worker draw the same.
func TestRequestGenSeeds(t *testing.T) {
	cfg := DefaultConfig()
	seq := func(worker int) (out []string) {
		g := newRequestGen(cfg, worker)
		for range 20 {
			out = append(out, g.subject())
		}
		return out
	}
	a, a2, b := seq(0), seq(0), seq(1)
	if !equal(a, a2) {
		t.Errorf("worker 0 drew %v then %v: not reproducible", a, a2)
	}
	if equal(a, b) {
		t.Errorf("workers 0 and 1 drew the same keys %v", a)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
