package rlqs

import (
	"slices"
	"sync"
)

// shares splits a lease's rate among the buckets it funds on this agent
// (all streams), by their reported demand: without it the first bucket to
// ask would hold the whole rate for as long as it keeps renewing. The
// split is max-min fair (fairShare): demand is what a client reports, so
// a bucket claiming more than the others must not take their part.
type shares struct {
	mu sync.Mutex
	d  map[string]map[*bucketState]float64 // by rule and subject
	// all is share's scratch: a lend allocates nothing.
	all []float64
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
func (s *shares) share(key string, b *bucketState, capacity float64) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.d[key]
	mine, ok := m[b]
	if !ok {
		return 0
	}
	s.all = s.all[:0]
	for _, d := range m {
		s.all = append(s.all, d)
	}
	return fairShare(mine, s.all, capacity)
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
	}
}
