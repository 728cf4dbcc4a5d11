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
