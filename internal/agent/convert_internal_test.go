package agent

import (
	"math"
	"testing"
	"time"
)

// ceilMillis rounds up to whole milliseconds, never down, and does not
// overflow for the longest durations (a leased decision's Retry-After when
// the lease refills at a rate near zero).
func TestCeilMillis(t *testing.T) {
	for _, tt := range []struct {
		in   time.Duration
		want int64
	}{
		{0, 0}, {-time.Millisecond, 0}, {math.MinInt64, 0}, {1, 1}, {time.Millisecond, 1},
		{time.Millisecond + 1, 2}, {1500 * time.Microsecond, 2}, {time.Hour, 3600000},
		{math.MaxInt64, math.MaxInt64/int64(time.Millisecond) + 1},
	} {
		if got := ceilMillis(tt.in); got != tt.want {
			t.Errorf("ceilMillis(%v) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

// floorInt is the floor of a token count as an int, 0 for what is not a
// positive number, and at most MaxInt64/2 (+1 for the float nearest it).
func TestFloorInt(t *testing.T) {
	for _, tt := range []struct {
		in   float64
		want int64
	}{
		{0, 0}, {-3, 0}, {math.Copysign(0, -1), 0}, {math.NaN(), 0}, {math.Inf(-1), 0},
		{0.5, 0}, {1, 1}, {1.9999, 1}, {127.99, 127}, {1e15 + 0.5, 1e15},
		{math.MaxInt64 / 2, math.MaxInt64/2 + 1}, {1e300, math.MaxInt64 / 2}, {math.Inf(1), math.MaxInt64 / 2},
	} {
		if got := floorInt(tt.in); got != tt.want {
			t.Errorf("floorInt(%v) = %d, want %d", tt.in, got, tt.want)
		}
	}
}
