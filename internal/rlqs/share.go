package rlqs

import "sync"

// shares splits a lease's rate among the buckets it funds on this agent
// (all streams), by their reported demand: without it the first bucket to
// ask would hold the whole rate for as long as it keeps renewing.
type shares struct {
	mu sync.Mutex
	d  map[string]map[*bucketState]float64 // by rule and subject
}

// set records b's demand (tokens per second) for the quota key and returns
// b's share of the quota's demand on this agent, in (0, 1].
func (s *shares) set(key string, b *bucketState, demand float64) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.d[key]
	if m == nil {
		m = map[*bucketState]float64{}
		s.d[key] = m
	}
	demand = max(1, demand) // an idle bucket still gets a little
	m[b] = demand
	if b.shareKeys == nil {
		b.shareKeys = map[string]bool{}
	}
	b.shareKeys[key] = true
	var sum float64
	for _, d := range m {
		sum += d
	}
	return demand / sum
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
