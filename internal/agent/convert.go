package agent

import (
	"math"
	"time"
)

// ceilMillis rounds up so that a client waiting the advertised time never
// arrives early.
func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	// Not (d + time.Millisecond - 1) / time.Millisecond: that overflows
	// for the longest durations (a lease's refill rate near zero).
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

func floorInt(f float64) int64 {
	if f <= 0 || math.IsNaN(f) {
		return 0
	}
	if f > math.MaxInt64/2 {
		return math.MaxInt64 / 2
	}
	return int64(math.Floor(f))
}
