package sim

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"time"
)

// event is something that happens at a simulated instant (true time, µs).
// seq breaks ties in the order events were scheduled: one seed, one order.
type event struct {
	at  int64
	seq uint64
	fn  func()
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = event{}
	*q = old[:len(old)-1]
	return e
}

// clock is a host's clock: offset plus true time scaled by 1+drift.
type clock struct {
	off   int64
	drift float64
}

func (c clock) at(now int64) int64 { return now + c.off + int64(math.Floor(c.drift*float64(now))) }

// trueAt inverts at, rounding up: the first true instant the clock reads t.
func (c clock) trueAt(t int64) int64 {
	v := int64(math.Ceil(float64(t-c.off) / (1 + c.drift)))
	for c.at(v) < t {
		v++
	}
	return v
}

func us(d time.Duration) int64 { return d.Microseconds() }

// exp draws an exponential duration of the given mean.
func (s *Sim) exp(mean time.Duration) int64 {
	if mean <= 0 {
		return 0
	}
	return int64(s.rng.ExpFloat64() * float64(us(mean)))
}

// poisson draws a Poisson count of mean lambda.
func poisson(r *rand.Rand, lambda float64) int {
	if lambda <= 0 {
		return 0
	}
	if lambda > 30 {
		v := math.Round(lambda + math.Sqrt(lambda)*r.NormFloat64())
		return int(max(0, v))
	}
	l, k, p := math.Exp(-lambda), 0, 1.0
	for {
		p *= r.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

func (s *Sim) at(t int64, fn func()) {
	s.seq++
	heap.Push(&s.queue, event{at: max(t, s.now), seq: s.seq, fn: fn})
}

func (s *Sim) after(d int64, fn func()) { s.at(s.now+d, fn) }

// every runs fn at start, start+period, ... until the end of the run.
func (s *Sim) every(start, period int64, fn func()) {
	var tick func()
	tick = func() {
		fn()
		if s.now+period <= s.end {
			s.after(period, tick)
		}
	}
	s.at(start, tick)
}

// endpoint is one host on the simulated network: an agent or a
// coordinator node, in a region.
type endpoint struct {
	region int
	node   *cnode // nil for an agent
	agent  *agent
}

// partition cuts every message between a host for which a holds and one
// for which b holds, both ways, from..to.
type partition struct {
	name     string
	from, to int64
	a, b     func(endpoint) bool
}

func (s *Sim) blocked(x, y endpoint) bool {
	for _, p := range s.partitions {
		if s.now < p.from || s.now >= p.to {
			continue
		}
		if (p.a(x) && p.b(y)) || (p.a(y) && p.b(x)) {
			return true
		}
	}
	return false
}

// latency draws one message's one-way delay.
func (s *Sim) latency(x, y endpoint) int64 {
	var d int64
	if x.region == y.region {
		d = us(s.cfg.LocalBase) + s.exp(s.cfg.LocalJitter)
	} else {
		d = s.cross[x.region][y.region] + s.exp(s.cfg.CrossJitter)
	}
	if s.rng.Float64() < s.cfg.Reorder {
		d += s.exp(s.cfg.Spike)
	}
	return max(d, 1)
}

// send delivers fn at y after a drawn latency, unless the link is cut or
// the message is lost; it may deliver it twice.
func (s *Sim) send(x, y endpoint, fn func()) {
	s.stats.messages++
	if s.blocked(x, y) {
		s.stats.cut++
		return
	}
	if s.rng.Float64() < s.cfg.Loss {
		s.stats.lost++
		return
	}
	s.after(s.latency(x, y), fn)
	if s.rng.Float64() < s.cfg.Dup {
		s.stats.duplicated++
		s.after(s.latency(x, y), fn)
	}
}
