package lease

import "time"

// A holder's sequence numbers (see doc.go, Idempotence) start at its clock
// and grow by one per command, far slower than the clock. A coordinator
// refuses a number more than MaxSeqAhead past its own clock: applied, it
// would make every later request of that holder stale, a lock-out bought
// with one call by anyone who may act as the holder. A holder refused as
// stale all the same (an earlier incarnation's or leader's numbers ran
// ahead, or someone sent one within the limit) moves past every number
// the limit admits (PastStale): its next request is accepted once the
// clocks have moved StaleMargin, whatever number was sent before.

// MaxSeqAhead bounds how far a holder command's sequence number may be
// ahead of the coordinator's clock, in microseconds since the epoch.
const MaxSeqAhead = time.Hour

// StaleMargin is what PastStale stays below the limit by: the clock
// offset between a holder and the coordinators it allows for.
const StaleMargin = 10 * time.Second

// FirstSeq is a new holder's first sequence number at nowMicros (its
// clock, microseconds since the epoch): numbers of an earlier incarnation
// that started at its own clock stay below, and the limit far above.
func FirstSeq(nowMicros int64) uint64 {
	return uint64(max(1, nowMicros))
}

// PastStale is the sequence number to continue from after a request
// numbered up to seq-1 was refused as stale at nowMicros: past every
// number a coordinator whose clock is within StaleMargin of this one
// admits now (MaxSeqAhead), so a refusal caused by any earlier number is
// not met again.
func PastStale(seq uint64, nowMicros int64) uint64 {
	limit := nowMicros + (MaxSeqAhead - StaleMargin).Microseconds()
	return max(seq+1, uint64(max(1, limit)))
}
