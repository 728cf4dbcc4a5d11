package agent

import (
	"fmt"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
)

func recordSteps(key string) []step {
	return []step{{req: bucket.Request{Key: key}}}
}

// shardSizes returns the live entries and the queue lengths, summed.
func (r *requestRecord) sizes() (live, queued, maxQueue int) {
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		live += len(sh.m)
		q := len(sh.fifo) - sh.head
		queued += q
		maxQueue = max(maxQueue, q)
		sh.mu.Unlock()
	}
	return live, queued, maxQueue
}

// The record's memory is bounded whatever the traffic: kept answers by
// the entry bound (oldest dropped first), answers it does not keep (Redis
// alone decided them) by compaction of the queue, and everything by the
// TTL.
func TestRequestRecordBounded(t *testing.T) {
	const limit = 256
	per := limit / recordShards
	tests := []struct {
		name string
		keep bool
	}{{"kept", true}, {"dropped", false}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRequestRecord(limit, time.Minute, time.Second)
			// One long-lived entry per shard at the head of each queue, so
			// compaction (not expiry) has to bound the dropped ones.
			for i := 0; i < 4*recordShards; i++ {
				c := r.claim(0, &claims{}, 0, fmt.Sprintf("head-%d", i), recordSteps("k"))
				r.finish(c.e, Response{Allowed: true}, true)
			}
			for i := 0; i < 50000; i++ {
				c := r.claim(1, &claims{}, 0, fmt.Sprintf("id-%d", i), recordSteps("k"))
				if c.kind != claimFresh {
					t.Fatalf("id-%d: claim %v, want fresh", i, c.kind)
				}
				r.finish(c.e, Response{Allowed: true}, tt.keep)
			}
			live, queued, maxQueue := r.sizes()
			if live > limit || maxQueue > 2*per+16+1 {
				t.Fatalf("after 50000 requests: %d live entries (bound %d), %d queued, longest queue %d (bound %d)",
					live, limit, queued, maxQueue, 2*per+17)
			}
		})
	}
}

// An answer is replayed until its TTL, then forgotten; a claim in flight
// makes a concurrent duplicate wait and a duplicate in the same batch copy.
func TestRequestRecordClaims(t *testing.T) {
	ttl := time.Minute
	r := newRequestRecord(1024, ttl, time.Second)
	a, b := &claims{}, &claims{}
	steps := recordSteps("rule|x")

	c := r.claim(0, a, 3, "id", steps)
	if c.kind != claimFresh {
		t.Fatalf("first claim = %v, want fresh", c.kind)
	}
	if d := r.claim(0, a, 5, "id", steps); d.kind != claimDup || d.dup != 3 {
		t.Fatalf("same batch = %+v, want dup of item 3", d)
	}
	w := r.claim(0, b, 0, "id", steps)
	if w.kind != claimWait {
		t.Fatalf("other batch while in flight = %v, want wait", w.kind)
	}
	if o := r.claim(0, b, 0, "id", recordSteps("rule|y")); o.kind != claimFresh {
		t.Fatalf("same id, other bucket = %v, want fresh (a different request)", o.kind)
	}
	r.finish(c.e, Response{Allowed: true, Remaining: 7}, true)
	select {
	case <-w.e.waitc:
	default:
		t.Fatal("the waiter was not woken when the answer was recorded")
	}
	if p := r.claim(int64(ttl)-1, b, 0, "id", steps); p.kind != claimReplay || p.resp.Remaining != 7 {
		t.Fatalf("before the TTL = %+v, want the recorded answer", p)
	}
	if p := r.claim(int64(ttl), b, 0, "id", steps); p.kind != claimFresh {
		t.Fatalf("at the TTL = %v, want fresh (forgotten)", p.kind)
	}
}
