package admission

import (
	"slices"
	"sync"
	"time"
)

// Record is one admitted request.
type Record struct {
	At    time.Duration // monotonic, since the recorder's origin
	Quota string
	Cost  float64
	Agent string
}

// Recorder collects admissions from concurrent goroutines.
type Recorder struct {
	origin time.Time
	mu     sync.Mutex
	recs   []Record
}

// NewRecorder starts a recorder whose clock starts now.
func NewRecorder() *Recorder { return &Recorder{origin: time.Now()} }

// Admit records an admission now.
func (r *Recorder) Admit(agent, quota string, cost float64) {
	at := time.Since(r.origin)
	r.mu.Lock()
	r.recs = append(r.recs, Record{At: at, Quota: quota, Cost: cost, Agent: agent})
	r.mu.Unlock()
}

// Now is the recorder's clock.
func (r *Recorder) Now() time.Duration { return time.Since(r.origin) }

// Records returns a copy of what was recorded, in time order.
func (r *Recorder) Records() []Record {
	r.mu.Lock()
	out := slices.Clone(r.recs)
	r.mu.Unlock()
	slices.SortStableFunc(out, func(a, b Record) int { return int(a.At - b.At) })
	return out
}

// Report is the checker's verdict on one quota.
type Report struct {
	Quota    string
	Burst    float64
	Rate     float64
	Admitted float64 // total cost admitted
	// Overshoot is the largest max(level) - Burst over the run (<= 0 when
	// the bound held), and [From, To] the window where it happened: from
	// the last time the level was empty to the admission that peaked.
	Overshoot float64
	From, To  time.Duration
	// Utilisation is Admitted / (Burst + Rate * span), span being from the
	// first to the last admission.
	Utilisation float64
}

// Check replays the admissions of one quota (records of other quotas are
// skipped) through a leaky bucket of (burst, rate).
func Check(recs []Record, quota string, burst, rate float64) Report {
	rep := Report{Quota: quota, Burst: burst, Rate: rate, Overshoot: -burst}
	var level float64
	var last, emptySince, first time.Duration
	seen := false
	for _, r := range recs {
		if r.Quota != quota {
			continue
		}
		if !seen {
			seen, first, last, emptySince = true, r.At, r.At, r.At
		}
		drained := rate * (r.At - last).Seconds()
		if level <= drained {
			level, emptySince = 0, r.At
		} else {
			level -= drained
		}
		last = r.At
		level += r.Cost
		rep.Admitted += r.Cost
		if o := level - burst; o > rep.Overshoot {
			rep.Overshoot, rep.From, rep.To = o, emptySince, r.At
		}
	}
	if seen {
		if allowed := burst + rate*(last-first).Seconds(); allowed > 0 {
			rep.Utilisation = rep.Admitted / allowed
		}
	}
	return rep
}
