package main

import (
	"testing"
	"time"
)

func TestScheduleAt(t *testing.T) {
	start := time.Unix(1000, 0)
	// 1000 decisions/s in batches of 100: 10 calls a second, 100ms apart.
	s := newSchedule(start, callRate(1000, 100))
	for _, c := range []struct {
		k    int64
		want time.Duration
	}{{0, 0}, {1, 100 * time.Millisecond}, {3, 300 * time.Millisecond}, {36000, time.Hour}} {
		if got := s.at(c.k).Sub(start); got != c.want {
			t.Errorf("at(%d) = start+%v, want start+%v", c.k, got, c.want)
		}
	}
	// A period that is not a whole number of nanoseconds does not drift:
	// 3 calls/s, call 3e6 is due exactly 1e6 seconds in.
	s3 := newSchedule(start, 3)
	if got := s3.at(3_000_000).Sub(start); got != 1_000_000*time.Second {
		t.Errorf("3/s: at(3e6) = start+%v, want start+1e6s", got)
	}
	if got := s3.at(1).Sub(start); got != 333333333 {
		t.Errorf("3/s: at(1) = start+%dns, want 333333333ns", got)
	}
}

func TestScheduleCountBefore(t *testing.T) {
	start := time.Unix(1000, 0)
	s := newSchedule(start, 10) // every 100ms
	for _, c := range []struct {
		at   time.Duration
		want int64
	}{
		{-time.Second, 0},
		{0, 0},                      // call 0 is due at start: not strictly before
		{1, 1},                      // call 0 is
		{100 * time.Millisecond, 1}, // call 1 due exactly now: not before
		{100*time.Millisecond + 1, 2},
		{time.Second, 10},
		{10 * time.Second, 100},
	} {
		if got := s.countBefore(start.Add(c.at)); got != c.want {
			t.Errorf("countBefore(start%+v) = %d, want %d", c.at, got, c.want)
		}
	}
	// Consistent with at() for an awkward rate, at and around every call time.
	s7 := newSchedule(start, 7)
	for k := range int64(200) {
		at := s7.at(k)
		if got := s7.countBefore(at); got != k {
			t.Fatalf("7/s: countBefore(at(%d)) = %d, want %d", k, got, k)
		}
		if got := s7.countBefore(at.Add(1)); got != k+1 {
			t.Fatalf("7/s: countBefore(at(%d)+1ns) = %d, want %d", k, got, k+1)
		}
	}
}

// The open loop's window of a run: warmup then duration, at the rate asked.
func TestScheduleWindowArithmetic(t *testing.T) {
	start := time.Unix(0, 0)
	s := newSchedule(start, callRate(50000, 1))
	measure, end := start.Add(time.Second), start.Add(6*time.Second)
	if got := s.countBefore(end) - s.countBefore(measure); got != 250000 {
		t.Errorf("50k/s over 5s after 1s warmup: %d calls due, want 250000", got)
	}
	sb := newSchedule(start, callRate(50000, 100))
	if got := (sb.countBefore(end) - sb.countBefore(measure)) * 100; got != 250000 {
		t.Errorf("50k/s in batches of 100: %d decisions due, want 250000", got)
	}
}
