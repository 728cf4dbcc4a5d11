package rlqs

// The rate lent to Envoys, integrated over time.

import (
	"sync"
)

// rateLedger integrates the refill rate lent to Envoys (tokens_per_fill,
// taken out of the leases' own refill) over the time it is lent: the
// tokens Envoy's buckets could have refilled under it.
type rateLedger struct {
	mu    sync.Mutex
	rate  float64 // tokens per second lent now
	at    int64   // µs, the funds' clock
	total float64 // tokens
}

// change adds d to the rate lent from now on.
func (l *rateLedger) change(now int64, d float64) {
	l.mu.Lock()
	l.advance(now)
	l.rate = max(0, l.rate+d)
	l.mu.Unlock()
}

// read is the integral up to now.
func (l *rateLedger) read(now int64) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.advance(now)
	return l.total
}

func (l *rateLedger) advance(now int64) {
	if now > l.at {
		l.total += l.rate * float64(now-l.at) / 1e6
		l.at = now
	}
}
