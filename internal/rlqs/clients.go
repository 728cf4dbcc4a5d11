package rlqs

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/peer"
)

// clientOf names the client of a stream for its bound
// (Options.MaxClientStreams): its connection. (Not its certificate: the
// Envoys of one gateway fleet often share one, and would share the bound.)
func clientOf(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "unknown"
	}
	return "conn:" + p.Addr.String()
}

// clientStreams counts the open streams of each client.
type clientStreams struct {
	mu sync.Mutex
	n  map[string]int
}

// take counts a new stream of client, unless it holds max already.
func (c *clientStreams) take(client string, max int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	if c.n[client] >= max {
		return false
	}
	c.n[client]++
	return true
}

// give forgets a stream of client that ended.
func (c *clientStreams) give(client string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[client]--; c.n[client] <= 0 {
		delete(c.n, client)
	}
}

// refusalEvery spaces out the log lines of refused and ended streams:
// a client that opens streams in a loop must not flood the log.
const refusalEvery = 10 * time.Second

// refusalLog logs a refusal at most once per refusalEvery, saying how
// many were not logged since (ration_rlqs_refused_total counts them all).
type refusalLog struct {
	last    atomic.Int64 // unix nanos of the last line
	skipped atomic.Int64
}

func (r *refusalLog) log(l *slog.Logger, msg string, args ...any) {
	now := time.Now().UnixNano()
	last := r.last.Load()
	if now-last < int64(refusalEvery) || !r.last.CompareAndSwap(last, now) {
		r.skipped.Add(1)
		return
	}
	l.Warn(msg, append(args, "not_logged_since", r.skipped.Swap(0))...)
}
