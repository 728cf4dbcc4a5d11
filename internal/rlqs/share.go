package rlqs

import (
	"slices"
	"sync"
	"time"
)

// shares splits a lease's rate among the buckets it funds on this agent
// (all streams), by their reported demand: without it the first bucket to
// ask would hold the whole rate for as long as it keeps renewing. The
// split is max-min fair (fairShare): demand is what a client reports, so
// a bucket claiming more than the others must not take their part.
//
// The lease's cap bounds the max_tokens lent at once, at least 1 per
// bucket, so past cap buckets they are funded in turn: a bucket the lease
// cannot fund waits (wait), in order of its arrival, is funded before
// those that came after it, and one that has held a loan for a turn while
// others wait gives it up (lend).
type shares struct {
	mu sync.Mutex
	d  map[string]map[*bucketState]float64 // by rule and subject
	// wait holds, by rule and subject, the buckets refused a loan for
	// want of tokens, with when they began to wait.
	wait map[string]map[*bucketState]int64
	// yielded counts, by rule and subject, the loans given up for a
	// waiting bucket that no waiting bucket has been lent yet: one token
	// of the balance is kept for each (yield).
	yielded map[string]int
	// all is share's scratch: a lend allocates nothing.
	all []float64
}

// yield says whether b, lent a loan of the quota key since start, gives
// it up now: it has held it for a turn, a bucket waits that came before
// it would again, and the balance (tokens) holds a token for that bucket
// beyond those kept for the loans given up already. So one turn ends as
// another can begin, not all at once. b then waits behind the others.
func (s *shares) yield(key string, b *bucketState, start, now int64, tokens, rate float64) bool {
	if start == 0 || now-start < turnFor(rate) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.wait[key]
	if _, waits := w[b]; waits || len(w) == 0 || tokens < float64(1+s.yielded[key]) {
		return false
	}
	s.yielded[key]++
	w[b] = now
	if b.shareKeys == nil {
		b.shareKeys = map[string]bool{}
	}
	b.shareKeys[key] = true
	return true
}

func newShares() shares {
	return shares{d: map[string]map[*bucketState]float64{}, wait: map[string]map[*bucketState]int64{}, yielded: map[string]int{}}
}

// turn is how long a bucket keeps its loan while others of its quota
// wait for one; a few report intervals, so that a turn's max_tokens and
// refill are spent before it is given up.
const turn = 5 * time.Second

// turnFor is the turn (µs) of a loan refilling rate tokens per second:
// turn, or as long as it takes to refill two tokens if that is shorter
// (at least a second). Forty buckets sharing 4.5/s five at a time, with
// 5 s turns, served 20-30 of them in 20 s; handing over once a loan has
// refilled two tokens serves all of them.
func turnFor(rate float64) int64 {
	t := turn.Microseconds()
	if rate > 0 {
		t = min(t, max(time.Second.Microseconds(), int64(2e6/rate)))
	}
	return t
}

// waitFor records that b (with demand) could not be lent a loan of the
// quota key at now for want of tokens: it waits for its turn.
func (s *shares) waitFor(key string, b *bucketState, now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.wait[key]
	if w == nil {
		w = map[*bucketState]int64{}
		s.wait[key] = w
	}
	if _, ok := w[b]; !ok {
		w[b] = now
	}
	if b.shareKeys == nil {
		b.shareKeys = map[string]bool{}
	}
	b.shareKeys[key] = true
}

// funded records that b holds a loan of the quota key: it waits no more.
func (s *shares) funded(key string, b *bucketState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.wait[key]; w != nil {
		if _, ok := w[b]; ok && s.yielded[key] > 0 {
			s.yielded[key]-- // a turn begins where one was given up
		}
		delete(w, b)
		if len(w) == 0 {
			delete(s.wait, key)
			delete(s.yielded, key)
		}
	}
}

// ahead is how many buckets have waited for a loan of the quota key
// longer than b (all that wait, if b does not).
func (s *shares) ahead(key string, b *bucketState) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.wait[key]
	since, waits := w[b]
	n := 0
	for o, t := range w {
		if o != b && (!waits || t < since || (t == since && o.seq < b.seq)) {
			n++
		}
	}
	return n
}

// set records b's demand (tokens per second) for the quota key, within 1
// (an idle bucket still gets a little) and limit, the rule's rate: no
// bucket is ever given more, so a larger claim could only weigh against
// the others.
func (s *shares) set(key string, b *bucketState, demand, limit float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.d[key]
	if m == nil {
		m = map[*bucketState]float64{}
		s.d[key] = m
	}
	m[b] = min(max(1, demand), max(1, limit))
	if b.shareKeys == nil {
		b.shareKeys = map[string]bool{}
	}
	b.shareKeys[key] = true
}

// share is b's part of capacity (the rate of the quota's lease that may be
// lent), per second, among the quota's buckets on this agent; 0 if b has
// no demand recorded (set).
//
// At most slots buckets can hold a loan at once (each holds a whole token
// at least, and the lease's cap bounds what is lent): when more have
// demand, the rate is split as among slots of them, so that the rate of
// the buckets funded now is lent, not kept for those that wait their turn
// (unlent, it would refill a balance the lent tokens already fill to the
// cap, and be lost). n is how many buckets have demand.
func (s *shares) share(key string, b *bucketState, capacity float64, slots int) (share float64, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.d[key]
	mine, ok := m[b]
	if !ok {
		return 0, len(m)
	}
	s.all = s.all[:0]
	for _, d := range m {
		s.all = append(s.all, d)
	}
	if slots = max(1, slots); len(m) > slots {
		capacity *= float64(len(m)) / float64(slots)
	}
	return fairShare(mine, s.all, capacity), len(m)
}

// fairShare is what a bucket of demand mine is given of capacity among
// buckets of demands all (mine among them; reordered). When the demands
// exceed it, its max-min fair allocation: a bucket asking less than the
// level gets what it asks, and the level is what is left split equally
// among the others; so a bucket claiming any demand takes no more than
// an equal part from those asking more than it, and nothing from those
// asking less. When they fit, what is left is spread in proportion to
// demand (every bucket gets more than it asks), so that a growing demand
// finds room before its next report.
func fairShare(mine float64, all []float64, capacity float64) float64 {
	if capacity <= 0 || mine <= 0 {
		return 0
	}
	var sum float64
	for _, d := range all {
		sum += d
	}
	if sum <= capacity {
		return min(capacity, capacity*mine/sum)
	}
	slices.Sort(all)
	left := capacity
	for i, d := range all {
		if level := left / float64(len(all)-i); d >= level {
			return min(mine, level)
		}
		left -= d
	}
	return min(mine, capacity) // not reached: the demands exceed capacity
}

// drop forgets b (abandoned, or its stream ended).
func (s *shares) drop(b *bucketState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key := range b.shareKeys {
		if m := s.d[key]; m != nil {
			delete(m, b)
			if len(m) == 0 {
				delete(s.d, key)
			}
		}
		if w := s.wait[key]; w != nil {
			delete(w, b)
			if len(w) == 0 {
				delete(s.wait, key)
				delete(s.yielded, key)
			}
		}
	}
}
