package sim

import (
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

// eventQueue is a binary min-heap of events by (at, seq). It is typed
// rather than a container/heap.Interface: that boxed every pushed event
// into an interface (an allocation each) and called Less and Swap through
// it, a twentieth of a reference run. seq is unique, so the order events
// come out in is total: any correct heap pops the same sequence.
type eventQueue []event

func (e *event) before(f *event) bool {
	if e.at != f.at {
		return e.at < f.at
	}
	return e.seq < f.seq
}

func (q eventQueue) Len() int { return len(q) }

func (q *eventQueue) push(e event) {
	*q = append(*q, e)
	h := *q
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].before(&h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

// pop takes the earliest event out; the queue must not be empty.
func (q *eventQueue) pop() event {
	h := *q
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h[n] = event{} // let the closure go
	h = h[:n]
	*q = h
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r].before(&h[l]) {
			m = r
		}
		if !h[m].before(&h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	return top
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
	s.queue.push(event{at: max(t, s.now), seq: s.seq, fn: fn})
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
