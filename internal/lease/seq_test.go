package lease

import (
	"testing"
	"time"
)

func TestPastStaleMovesPastWhatACoordinatorAdmits(t *testing.T) {
	now := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC).UnixMicro()
	limit := uint64(now + MaxSeqAhead.Microseconds())
	for _, c := range []struct {
		name string
		seq  uint64
		want uint64
	}{
		{"from a clock-based seq", FirstSeq(now), limit - uint64(StaleMargin.Microseconds())},
		{"from a seq already past it", limit, limit + 1},
		{"from 1 at the epoch", 1, uint64((MaxSeqAhead - StaleMargin).Microseconds())},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := now
			if c.seq == 1 {
				n = 0
			}
			if got := PastStale(c.seq, n); got != c.want {
				t.Fatalf("PastStale(%d, %d) = %d, want %d", c.seq, n, got, c.want)
			}
		})
	}
	if FirstSeq(-5) != 1 || FirstSeq(now) != uint64(now) {
		t.Fatalf("FirstSeq: %d, %d", FirstSeq(-5), FirstSeq(now))
	}
}
