package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// shard holds the measurements of some workers. Workers share few shards
// (worker w uses shard w % len) so memory stays bounded at any concurrency;
// the lock is held only to add one call's numbers.
type shard struct {
	mu        sync.Mutex
	lat       *hdrhistogram.Histogram // per call (unary modes: per decision)
	amort     *hdrhistogram.Histogram // batch: per decision, call latency / size; else nil
	maxLat    int64
	maxAmort  int64
	calls     int64
	decisions int64
	counts    tally
}

func newShard(batch bool) *shard {
	s := &shard{lat: newHist(), counts: tally{}}
	if batch {
		s.amort = newHist()
	}
	return s
}

// add records one measured call of n decisions and its outcomes.
func (s *shard) add(lat time.Duration, n int, t tally) {
	ns := clampNanos(lat)
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.lat.RecordValue(ns) // in range by clampNanos
	s.maxLat = max(s.maxLat, ns)
	if s.amort != nil {
		a := max(ns/int64(n), 1)
		_ = s.amort.RecordValues(a, int64(n))
		s.maxAmort = max(s.maxAmort, a)
	}
	s.calls++
	s.decisions += int64(n)
	for k, v := range t {
		s.counts[k] += v
	}
}

// totals is every shard merged.
type totals struct {
	lat, amort       *hdrhistogram.Histogram
	maxLat, maxAmort int64
	calls, decisions int64
	counts           tally
}

func merge(shards []*shard) totals {
	t := totals{lat: newHist(), counts: tally{}}
	for _, s := range shards {
		s.mu.Lock()
		t.lat.Merge(s.lat)
		if s.amort != nil {
			if t.amort == nil {
				t.amort = newHist()
			}
			t.amort.Merge(s.amort)
		}
		t.maxLat = max(t.maxLat, s.maxLat)
		t.maxAmort = max(t.maxAmort, s.maxAmort)
		t.calls += s.calls
		t.decisions += s.decisions
		for k, v := range s.counts {
			t.counts[k] += v
		}
		s.mu.Unlock()
	}
	return t
}

// job is one call the open loop's dispatcher hands to a worker.
type job struct {
	at       time.Time // intended start: latency counts from here
	n        int       // decisions
	measured bool
}

// engine runs one benchmark: workers, the open loop's dispatcher, the
// -requests budget and the measurement window.
type engine struct {
	cfg          Config
	d            *dialer
	shards       []*shard
	perCall      int
	start        time.Time // load starts
	measureStart time.Time // warmup ends
	end          time.Time // zero: no deadline (-requests only)

	issued   atomic.Int64 // measured decisions handed out (-requests)
	stop     chan struct{}
	stopOnce sync.Once

	// open loop accounting, in decisions
	sent, unsent atomic.Int64
	// completed counts every decision answered, warmup included: the
	// progress line's rate.
	completed atomic.Int64
}

func newEngine(cfg Config, d *dialer) *engine {
	e := &engine{cfg: cfg, d: d, perCall: cfg.perCall(), stop: make(chan struct{})}
	for range min(cfg.workers(), 16) {
		e.shards = append(e.shards, newShard(cfg.Mode == modeBatch))
	}
	return e
}

func (e *engine) halt() { e.stopOnce.Do(func() { close(e.stop) }) }

func (e *engine) stopped() bool {
	select {
	case <-e.stop:
		return true
	default:
		return false
	}
}

// reserve takes up to want measured decisions from the -requests budget;
// 0 means it is spent. The call that spends the last of it halts the run.
func (e *engine) reserve(want int) int {
	limit := e.cfg.Requests
	if limit == 0 {
		return want
	}
	after := e.issued.Add(int64(want))
	before := after - int64(want)
	if before >= limit {
		e.halt()
		return 0
	}
	if after >= limit {
		e.halt()
		return int(limit - before)
	}
	return want
}

// pastEnd reports whether t is at or after the deadline.
func (e *engine) pastEnd(t time.Time) bool { return !e.end.IsZero() && !t.Before(e.end) }

// run drives the load until the deadline, the -requests cap or ctx ends,
// then waits for calls in flight. It returns when the last one answered.
func (e *engine) run(ctx context.Context, progress io.Writer, onMeasureStart func()) time.Time {
	defer e.halt() // ends the watcher below when the run ended by its deadline
	e.start = time.Now()
	e.measureStart = e.start.Add(e.cfg.Warmup)
	if e.cfg.Duration > 0 {
		e.end = e.measureStart.Add(e.cfg.Duration)
	}
	go func() {
		select {
		case <-ctx.Done():
			e.halt()
		case <-e.stop:
		}
	}()

	var wg sync.WaitGroup
	workers := e.cfg.workers()
	if e.cfg.Rate > 0 {
		jobs := make(chan job)
		for w := range workers {
			wg.Go(func() { e.openWorker(ctx, w, jobs) })
		}
		wg.Go(func() { e.dispatch(ctx, jobs) })
	} else {
		for w := range workers {
			wg.Go(func() { e.closedWorker(ctx, w) })
		}
	}

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if progress != nil {
		go e.progress(progress, done)
	}
	// The CPU window opens when the warmup ends (or the run, if sooner).
	select {
	case <-time.After(time.Until(e.measureStart)):
	case <-done:
	}
	onMeasureStart()
	<-done
	return time.Now()
}

// closedWorker keeps one call in flight until the run ends.
func (e *engine) closedWorker(ctx context.Context, w int) {
	c := e.d.caller(w)
	defer c.close()
	sh := e.shards[w%len(e.shards)]
	t := tally{}
	for !e.stopped() {
		now := time.Now()
		if e.pastEnd(now) {
			return
		}
		measured := !now.Before(e.measureStart)
		n := e.perCall
		if measured {
			if n = e.reserve(n); n == 0 {
				return
			}
		}
		clear(t)
		c.call(ctx, n, t)
		lat := time.Since(now)
		if ctx.Err() != nil {
			return // interrupted: the call's outcome is an artefact
		}
		e.completed.Add(int64(n))
		if measured {
			sh.add(lat, n, t)
		}
	}
}

// openWorker makes the calls the dispatcher hands it; latency counts from
// each call's intended start, so time spent queued behind a slow server
// shows (no coordinated omission).
func (e *engine) openWorker(ctx context.Context, w int, jobs <-chan job) {
	c := e.d.caller(w)
	defer c.close()
	sh := e.shards[w%len(e.shards)]
	t := tally{}
	for j := range jobs {
		clear(t)
		c.call(ctx, j.n, t)
		lat := time.Since(j.at)
		if ctx.Err() != nil {
			continue // interrupted; drain so the dispatcher can finish
		}
		e.completed.Add(int64(j.n))
		if j.measured {
			sh.add(lat, j.n, t)
		}
	}
}

// dispatch starts calls on the schedule. When every worker is busy it
// waits; calls that come due meanwhile start late (their latency counts
// from when they were due), and those still not started when the run ends
// are counted as unsent.
func (e *engine) dispatch(ctx context.Context, jobs chan<- job) {
	defer close(jobs)
	sched := newSchedule(e.start, callRate(e.cfg.Rate, e.perCall))
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for k := int64(0); ; k++ {
		at := sched.at(k)
		if e.pastEnd(at) {
			return
		}
		if e.pastEnd(time.Now()) {
			// Behind schedule at the deadline: what was due and never
			// started is the backlog the agent (or -max-outstanding)
			// could not absorb.
			from := max(k, sched.countBefore(e.measureStart))
			e.unsent.Add((sched.countBefore(e.end) - from) * int64(e.perCall))
			return
		}
		if wait := time.Until(at); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-e.stop:
				return
			}
		}
		j := job{at: at, n: e.perCall, measured: !at.Before(e.measureStart)}
		if j.measured {
			if j.n = e.reserve(j.n); j.n == 0 {
				return
			}
		}
		select {
		case jobs <- j:
		case <-ctx.Done():
			return
		}
		if j.measured {
			e.sent.Add(int64(j.n))
		}
		if e.stopped() {
			return // the -requests budget is spent (or the run interrupted)
		}
	}
}

// progress prints a line a second: decisions/s over the last second, and
// the measured outcomes and p99 so far.
func (e *engine) progress(w io.Writer, done <-chan struct{}) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last int64
	lastAt := e.start
	p99 := "p99"
	if e.perCall > 1 {
		p99 = "p99/call"
	}
	for {
		select {
		case <-done:
			return
		case now := <-tick.C:
			el := now.Sub(e.start).Round(time.Second)
			n := e.completed.Load()
			rate := float64(n-last) / now.Sub(lastAt).Seconds()
			last, lastAt = n, now
			if now.Before(e.measureStart.Add(100 * time.Millisecond)) {
				fmt.Fprintf(w, "%6s  %10s decisions/s  (warming up)\n", el, group(int64(rate)))
				continue
			}
			t := merge(e.shards)
			var a, d, x int64
			for k, v := range t.counts {
				switch k.kind {
				case kindAllowed:
					a += v
				case kindDenied:
					d += v
				default:
					x += v
				}
			}
			fmt.Fprintf(w, "%6s  %10s decisions/s  allowed %s  denied %s  errors %s  %s %s\n",
				el, group(int64(rate)), group(a), group(d), group(x), p99,
				fmtMicros(float64(t.lat.ValueAtPercentile(99))/1e3))
		}
	}
}
