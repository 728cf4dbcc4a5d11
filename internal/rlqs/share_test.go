package rlqs

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// fairShare gives each bucket its max-min fair part of the lease's rate:
// a claim of any size takes at most an equal part from the buckets asking
// more than the level, and nothing from those asking less.
func TestFairShare(t *testing.T) {
	tests := []struct {
		name     string
		demands  []float64
		capacity float64
		want     []float64 // each bucket's, in the order of demands
	}{
		{"equal demands", []float64{10, 10, 10, 10}, 20, []float64{5, 5, 5, 5}},
		{"one liar", []float64{20, 1 << 40}, 18, []float64{9, 9}},
		{"one liar, an honest bucket below the level", []float64{5, 1 << 40}, 18, []float64{5, 13}},
		{"five liars", []float64{5, 1 << 40, 1 << 40, 1 << 40, 1 << 40, 1 << 40}, 18, []float64{3, 3, 3, 3, 3, 3}},
		{"small demands below the level", []float64{2, 3, 100, 100}, 20, []float64{2, 3, 7.5, 7.5}},
		{"single bucket, demand below the capacity", []float64{5}, 20, []float64{20}},
		{"single bucket, demand above the capacity", []float64{50}, 20, []float64{20}},
		{"demands that fit: the rest in proportion", []float64{2, 6}, 16, []float64{4, 12}},
		{"demands exactly the capacity", []float64{4, 6, 10}, 20, []float64{4, 6, 10}},
		{"capacity 0", []float64{5, 10}, 0, []float64{0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, d := range tt.demands {
				all := append([]float64(nil), tt.demands...)
				if got := fairShare(d, all, tt.capacity); math.Abs(got-tt.want[i]) > 1e-9 {
					t.Errorf("bucket %d of demands %v, capacity %v: %v, want %v", i, tt.demands, tt.capacity, got, tt.want[i])
				}
			}
		})
	}
}

// Over random demands: the parts never sum past the capacity, every
// bucket gets at least the least of its demand and an equal part, and
// the whole capacity is given while any bucket wants more than it gets.
func TestFairShareProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := 1 + r.IntN(12)
		demands := make([]float64, n)
		for i := range demands {
			demands[i] = 1 + r.Float64()*float64(r.IntN(50))
			if r.IntN(6) == 0 {
				demands[i] = 1 << 40
			}
		}
		capacity := float64(r.IntN(60))
		var sum float64
		unmet := false
		for _, d := range demands {
			got := fairShare(d, append([]float64(nil), demands...), capacity)
			sum += got
			if floor := min(d, capacity/float64(n)); got < floor-1e-9 {
				t.Fatalf("demand %v of %v, capacity %v: %v, under %v", d, demands, capacity, got, floor)
			}
			if got < d-1e-9 {
				unmet = true
			}
		}
		if sum > capacity+1e-6 {
			t.Fatalf("demands %v, capacity %v: parts sum to %v", demands, capacity, sum)
		}
		if unmet && sum < capacity-1e-6 {
			t.Fatalf("demands %v, capacity %v: parts sum to %v while a bucket is short", demands, capacity, sum)
		}
	}
}

// A bucket's recorded demand is within 1 and the rule's rate, and is
// forgotten with the bucket.
func TestSharesCapDemand(t *testing.T) {
	s := shares{d: map[string]map[*bucketState]float64{}}
	honest, liar, idle := &bucketState{}, &bucketState{}, &bucketState{}
	s.set("q", honest, 100, 20)
	s.set("q", liar, 1<<40, 20)
	s.set("q", idle, 0, 20)
	if got := s.d["q"][liar]; got != 20 {
		t.Fatalf("a claim of 2^40 recorded as %v, want the rule's rate 20", got)
	}
	if got := s.d["q"][idle]; got != 1 {
		t.Fatalf("an idle bucket's demand recorded as %v, want 1", got)
	}
	// 1 to the idle bucket, the rest split between the two at the level.
	if got, _ := s.share("q", honest, 19, 100); got != 9 {
		t.Fatalf("the honest bucket's share %v, want 9", got)
	}
	s.drop(liar)
	if got, _ := s.share("q", liar, 19, 100); got != 0 {
		t.Fatalf("a dropped bucket's share %v, want 0", got)
	}
	if got, _ := s.share("q", honest, 19, 100); got != 18 {
		t.Fatalf("the honest bucket's share without the liar %v, want 18 (the rest in proportion)", got)
	}
}

// Past the slots a lease's cap can fund at once, the rate is split as
// among that many buckets: those funded now are lent it all, not a part
// kept for buckets that wait their turn.
func TestSharesSplitAmongSlots(t *testing.T) {
	s := newShares()
	bs := make([]*bucketState, 40)
	for i := range bs {
		bs[i] = &bucketState{seq: uint64(i + 1)}
		s.set("q", bs[i], 5, 5)
	}
	for _, tt := range []struct {
		slots int
		want  float64
	}{{100, 4.5 / 40}, {40, 4.5 / 40}, {8, 4.5 / 8}, {0, 4.5}} {
		if got, n := s.share("q", bs[0], 4.5, tt.slots); math.Abs(got-tt.want) > 1e-9 || n != 40 {
			t.Errorf("slots %d: share %v of %d buckets, want %v of 40", tt.slots, got, n, tt.want)
		}
	}
}

// Buckets refused for want of tokens are funded in the order they began
// to wait; one that held a loan for a turn gives it up only while another
// waits and the balance holds a token for it, one turn at a time, and then
// waits behind the others.
func TestSharesTurns(t *testing.T) {
	s := newShares()
	a, b, c := &bucketState{seq: 1}, &bucketState{seq: 2}, &bucketState{seq: 3}
	const sec = int64(1e6)
	s.waitFor("q", b, 10*sec)
	s.waitFor("q", c, 10*sec)
	if n := s.ahead("q", b); n != 0 {
		t.Fatalf("b, first to wait: %d ahead, want 0", n)
	}
	if n := s.ahead("q", c); n != 1 {
		t.Fatalf("c, made after b, waiting since the same moment: %d ahead, want 1", n)
	}
	if n := s.ahead("q", a); n != 2 {
		t.Fatalf("a, not waiting: %d ahead, want every waiting bucket (2)", n)
	}
	start := 5 * sec
	if s.yield("q", a, start, start+turn.Microseconds()-1, 10, 0) {
		t.Fatal("a gave up its loan before its turn was over")
	}
	if s.yield("q", a, start, 20*sec, 0.5, 0) {
		t.Fatal("a gave up its loan with no token in the balance for the bucket waiting")
	}
	if !s.yield("q", a, start, 20*sec, 1, 0) {
		t.Fatal("a kept its loan past its turn while b and c wait and a token is there")
	}
	if n := s.ahead("q", a); n != 2 {
		t.Fatalf("a, after giving up its turn: %d ahead, want b and c (2)", n)
	}
	other := &bucketState{seq: 4}
	if s.yield("q", other, start, 20*sec, 1, 0) {
		t.Fatal("a second turn ended on the one token kept for the first")
	}
	s.funded("q", b)
	if !s.yield("q", other, start, 20*sec, 1, 0) {
		t.Fatal("once b began its turn, the token kept for it is spent: another turn may end")
	}
	s.drop(c)
	if n := s.ahead("q", a); n != 0 {
		t.Fatalf("a, with b funded and c dropped: %d ahead, want 0", n)
	}
}

func TestTurnFor(t *testing.T) {
	sec := time.Second.Microseconds()
	for _, c := range []struct {
		rate float64
		want int64
	}{
		{0, turn.Microseconds()},   // no refill: a whole turn
		{0.1, turn.Microseconds()}, // two tokens take 20 s: a whole turn
		{0.9, 2222222},             // two tokens take 2.2 s
		{2, sec},                   // two tokens take a second
		{100, sec},                 // at least a second
		{math.Inf(1), sec},         // never below a second
	} {
		if got := turnFor(c.rate); got != c.want {
			t.Errorf("turnFor(%v) = %d µs, want %d", c.rate, got, c.want)
		}
	}
}
