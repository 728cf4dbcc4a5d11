package bucket

import (
	"encoding/binary"
	"math"
	"testing"
	"time"
)

const t0 = int64(1_700_000_000_000_000) // µs since the epoch, late 2023

func TestTake(t *testing.T) {
	l := Limit{Burst: 10, Rate: 2}
	tests := []struct {
		name      string
		s         State
		exists    bool
		cost      float64
		now       int64
		wantState State
		want      Result
	}{
		{"missing starts full", State{}, false, 3, t0,
			State{Tokens: 7, Last: t0}, Result{Allowed: true, Remaining: 7, Reset: 1500 * time.Millisecond, Now: t0}},
		{"exact balance allowed", State{Tokens: 3, Last: t0}, true, 3, t0,
			State{Tokens: 0, Last: t0}, Result{Allowed: true, Remaining: 0, Reset: 5 * time.Second, Now: t0}},
		{"short denies with retry", State{Tokens: 1, Last: t0}, true, 2, t0,
			State{Tokens: 1, Last: t0}, Result{Remaining: 1, RetryAfter: 500 * time.Millisecond, Reset: 4500 * time.Millisecond, Now: t0}},
		{"refill", State{Tokens: 0, Last: t0}, true, 1, t0 + 1_500_000,
			State{Tokens: 2, Last: t0 + 1_500_000}, Result{Allowed: true, Remaining: 2, Reset: 4 * time.Second, Now: t0 + 1_500_000}},
		{"refill caps at burst", State{Tokens: 9, Last: t0}, true, 1, t0 + 3_600_000_000,
			State{Tokens: 9, Last: t0 + 3_600_000_000}, Result{Allowed: true, Remaining: 9, Reset: 500 * time.Millisecond, Now: t0 + 3_600_000_000}},
		{"clock back: no refill, last kept", State{Tokens: 1, Last: t0}, true, 1, t0 - 5_000_000,
			State{Tokens: 0, Last: t0}, Result{Allowed: true, Remaining: 0, Reset: 5 * time.Second, Now: t0 - 5_000_000}},
		{"clock back: deny", State{Tokens: 0.5, Last: t0}, true, 1, t0 - 1,
			State{Tokens: 0.5, Last: t0}, Result{Remaining: 0.5, RetryAfter: 250 * time.Millisecond, Reset: 4750 * time.Millisecond, Now: t0 - 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gotState, got := Take(tt.s, tt.exists, l, tt.cost, tt.now)
			if gotState != tt.wantState || got != tt.want {
				t.Errorf("Take(%+v, %v, %v, %v) = %+v, %+v; want %+v, %+v",
					tt.s, tt.exists, tt.cost, tt.now, gotState, got, tt.wantState, tt.want)
			}
		})
	}
}

func TestTakeRateZero(t *testing.T) {
	l := Limit{Burst: 2, Rate: 0}
	s, r := Take(State{}, false, l, 2, t0)
	if !r.Allowed || s.Tokens != 0 {
		t.Fatalf("first take = %+v, %+v; want allowed, empty", s, r)
	}
	s, r = Take(s, true, l, 1, t0+3_600_000_000)
	want := Result{Now: t0 + 3_600_000_000}
	if r != want || s.Tokens != 0 {
		t.Errorf("take an hour later = %+v, %+v; want %+v (no refill, no retry, no reset)", s, r, want)
	}
}

func TestRefund(t *testing.T) {
	l := Limit{Burst: 10, Rate: 1}
	tests := []struct {
		name string
		s    State
		cost float64
		now  int64
		want State
	}{
		{"adds", State{Tokens: 2, Last: t0}, 3, t0, State{Tokens: 5, Last: t0}},
		{"caps at burst", State{Tokens: 8, Last: t0}, 5, t0, State{Tokens: 10, Last: t0}},
		{"refills first", State{Tokens: 2, Last: t0}, 3, t0 + 2_000_000, State{Tokens: 7, Last: t0 + 2_000_000}},
		{"clock back keeps last", State{Tokens: 2, Last: t0}, 1, t0 - 1_000_000, State{Tokens: 3, Last: t0}},
	}
	for _, tt := range tests {
		if got := Refund(tt.s, l, tt.cost, tt.now); got != tt.want {
			t.Errorf("%s: Refund(%+v, %v, %v) = %+v, want %+v", tt.name, tt.s, tt.cost, tt.now, got, tt.want)
		}
	}
}

func TestSecondsToDuration(t *testing.T) {
	tests := []struct {
		sec  float64
		want time.Duration
	}{
		{0, 0},
		{-1, 0},
		{math.NaN(), 0},
		{1e-10, 1},
		{0.5, 500 * time.Millisecond},
		{1.0000000001, time.Second + 1},
		{1e300, math.MaxInt64},
		{math.Inf(1), math.MaxInt64},
	}
	for _, tt := range tests {
		if got := secondsToDuration(tt.sec); got != tt.want {
			t.Errorf("secondsToDuration(%v) = %v, want %v", tt.sec, got, tt.want)
		}
	}
}

func TestExpiresAfter(t *testing.T) {
	margin := int64(expiryMargin / time.Microsecond)
	tests := []struct {
		name string
		s    State
		l    Limit
		now  int64
		want int64
	}{
		{"rate 0 forever", State{Tokens: 1, Last: t0}, Limit{10, 0}, t0, 0},
		{"full refill plus margin", State{Tokens: 0, Last: t0}, Limit{10, 4}, t0, 2_500_000 + margin},
		{"counts from a last ahead of now", State{Tokens: 0, Last: t0 + 7}, Limit{10, 4}, t0, 2_500_007 + margin},
		{"tiny rate forever", State{Tokens: 0, Last: t0}, Limit{1e12, 1e-9}, t0, 0},
	}
	for _, tt := range tests {
		if got := expiresAfter(tt.s, tt.l, tt.now); got != tt.want {
			t.Errorf("%s: expiresAfter = %d, want %d", tt.name, got, tt.want)
		}
		if tt.l.Rate > 0 && tt.want > 0 {
			if ttf := int64(tt.l.TimeToFull() / time.Microsecond); tt.want < ttf {
				t.Errorf("%s: expires after %dµs, before the time to full %dµs", tt.name, tt.want, ttf)
			}
		}
	}
}

func TestTimeToFullSaturates(t *testing.T) {
	if got := (Limit{Burst: 1e12, Rate: 1e-12}).TimeToFull(); got != math.MaxInt64 {
		t.Errorf("TimeToFull of a 1e24 s refill = %v, want the largest Duration", got)
	}
	if got := (Limit{Burst: 10, Rate: 4}).TimeToFull(); got != 2500*time.Millisecond {
		t.Errorf("TimeToFull(10, 4) = %v, want 2.5s", got)
	}
}

// FuzzModel runs a sequence of takes and refunds, with a clock that may step
// backwards, from an arbitrary starting state, and checks after every step
// that 0 <= tokens <= burst, that Last never moves back, that a decision
// follows the refilled balance, and, over the whole run, that admitted cost
// never exceeds the starting balance plus refill over the elapsed time plus
// refunds: the bucket never grants more than it holds.
func FuzzModel(f *testing.F) {
	f.Add(10.0, 1.0, 0.5, []byte{1, 0, 2, 0, 3, 128, 4, 255})
	f.Add(1.0, 0.0, 1.0, []byte{0, 0, 0, 0, 0, 0})
	f.Add(1e12, 1e12, 0.0, []byte{9, 9, 9, 200, 7, 1})
	f.Add(3.0, 1e-9, 0.25, []byte{250, 1, 3, 17, 240, 2})
	f.Fuzz(func(t *testing.T, burst, rate, fill float64, ops []byte) {
		l := Limit{Burst: burst, Rate: rate}
		if l.Validate() != nil || math.IsNaN(fill) {
			return
		}
		fill = math.Abs(math.Mod(fill, 1))
		s := State{Tokens: fill * burst, Last: t0}
		maxNow := s.Last
		allowance := s.Tokens // what may ever be admitted: start + refill + refunds
		admitted := 0.0
		for len(ops) >= 3 {
			op, dt, c := ops[0], ops[1], ops[2]
			ops = ops[3:]
			// dt moves the clock from -1.28s to +1.27s, in 10ms steps.
			now := maxNow + (int64(int8(dt)) * 10_000)
			cost := burst * (float64(c) + 1) / 256
			before := s
			if now > maxNow {
				allowance += rate * float64(now-maxNow) / 1e6
				maxNow = now
			}
			if op%4 == 0 {
				s = Refund(s, l, cost, now)
				allowance += cost
			} else {
				var r Result
				s, r = Take(s, true, l, cost, now)
				refilled := refill(before, l, now).Tokens
				if r.Allowed != (refilled >= cost) {
					t.Fatalf("Take(%+v, cost %v, now %v) allowed=%v with %v tokens after refill", before, cost, now, r.Allowed, refilled)
				}
				if r.Allowed {
					admitted += cost
				} else if rate > 0 && r.RetryAfter <= 0 {
					t.Fatalf("denied with rate %v but no retry-after: %+v", rate, r)
				}
				if r.Remaining != s.Tokens || r.Now != now {
					t.Fatalf("result %+v disagrees with state %+v at %v", r, s, now)
				}
			}
			if !(s.Tokens >= 0 && s.Tokens <= burst) {
				t.Fatalf("tokens %v outside [0, %v] after %+v at %v", s.Tokens, burst, before, now)
			}
			if s.Last < before.Last || s.Last != max(before.Last, now) {
				t.Fatalf("last %v, want max(%v, %v)", s.Last, before.Last, now)
			}
			// Float slack: a few ulps of the allowance per step.
			if admitted > allowance*(1+1e-12)+1e-9 {
				t.Fatalf("admitted %v > allowance %v (burst %v, rate %v)", admitted, allowance, burst, rate)
			}
		}
	})
}

// TestRetryAfterRefillsCost checks that waiting RetryAfter brings the balance
// up to the cost, for a spread of shapes: exactly in real arithmetic, so to
// within float rounding (a few ulps; a retry exactly at RetryAfter can still
// be denied by such a hair, which is why Retry-After headers round up to
// whole seconds).
func TestRetryAfterRefillsCost(t *testing.T) {
	var seed [8]byte
	for i := 0; i < 20000; i++ {
		binary.LittleEndian.PutUint64(seed[:], uint64(i)*0x9e3779b97f4a7c15)
		b := 1 + float64(seed[0])*(float64(seed[1])+1)/7
		r := (float64(seed[2]) + 1) * math.Pow(10, float64(int(seed[3]%12))-6)
		l := Limit{Burst: b, Rate: r}
		cost := b * (float64(seed[4]) + 1) / 256
		s := State{Tokens: b * float64(seed[5]) / 256, Last: t0}
		s, res := Take(s, true, l, cost, t0)
		if res.Allowed {
			continue
		}
		wait := int64((res.RetryAfter + time.Microsecond - 1) / time.Microsecond)
		if got := refill(s, l, t0+wait).Tokens; got < cost*(1-1e-12) {
			t.Fatalf("limit %+v cost %v: %v tokens after waiting RetryAfter %v", l, cost, got, res.RetryAfter)
		}
	}
}
