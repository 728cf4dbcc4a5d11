package agent

import "golang.org/x/sys/unix"

// monoNow is CLOCK_MONOTONIC in nanoseconds: one clock for every process on
// the host (Go's own monotonic readings are relative to each process's
// start and cannot be compared across processes).
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}
