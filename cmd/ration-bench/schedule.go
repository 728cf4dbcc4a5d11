package main

import (
	"math"
	"time"
)

// schedule is an open loop's timetable: call k (k = 0, 1, ...) is due at
// start + k/rate. Each time is computed from k, not by adding intervals, so
// rounding never drifts over a long run.
type schedule struct {
	start  time.Time
	period float64 // nanoseconds between calls
}

// newSchedule plans callsPerSec calls a second from start.
func newSchedule(start time.Time, callsPerSec float64) schedule {
	return schedule{start: start, period: 1e9 / callsPerSec}
}

// callRate converts a decision rate into calls per second for calls of
// perCall decisions each.
func callRate(decisionsPerSec float64, perCall int) float64 {
	return decisionsPerSec / float64(perCall)
}

// at is when call k is due.
func (s schedule) at(k int64) time.Time {
	return s.start.Add(time.Duration(math.Round(float64(k) * s.period)))
}

// countBefore is how many calls are due strictly before t: the smallest k
// with at(k) >= t.
func (s schedule) countBefore(t time.Time) int64 {
	el := t.Sub(s.start)
	if el <= 0 {
		return 0
	}
	k := int64(math.Ceil(float64(el) / s.period))
	// Correct the float estimate against at() itself, which rounds.
	for k > 0 && !s.at(k-1).Before(t) {
		k--
	}
	for s.at(k).Before(t) {
		k++
	}
	return k
}
