package admission

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Record is one decision. The overshoot judge counts admitted records;
// the refusal judge (Refusals) holds the refused ones against them.
type Record struct {
	// At is when the decision was known, on a clock shared by every
	// recording process of one host (CLOCK_MONOTONIC nanoseconds for the
	// agents' logs; time since the recorder's origin for a Recorder).
	At time.Duration
	// Latency is how long before At the decision started: the charge
	// happened somewhere in [At - Latency, At]. The checker widens the
	// bound by Rate x the largest Latency it saw (see Check).
	Latency time.Duration
	Agent   string
	Quota   string // one bucket: the store key of (rule, subject)
	Cost    float64
	Allowed bool
	Path    string // store, leased, fallback
	Reason  string // ok, over_limit, unavailable, emergency, ...
	Lease   string // lease id, when known ("" otherwise)
	// RequestID, when set, names the request across retries: a repeated
	// admitted id is one admission (the store charged it once).
	RequestID string
	// Burst and Rate are the quota's shape as the agent knew it.
	Burst, Rate float64
}

// Recorder collects admissions from concurrent goroutines of one process.
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
	r.recs = append(r.recs, Record{At: at, Quota: quota, Cost: cost, Agent: agent, Allowed: true})
	r.mu.Unlock()
}

// Now is the recorder's clock.
func (r *Recorder) Now() time.Duration { return time.Since(r.origin) }

// Records returns a copy of what was recorded, in time order.
func (r *Recorder) Records() []Record {
	r.mu.Lock()
	out := slices.Clone(r.recs)
	r.mu.Unlock()
	Sort(out)
	return out
}

// Sort orders records by time (stable: equal times keep their order).
func Sort(recs []Record) {
	slices.SortStableFunc(recs, func(a, b Record) int {
		switch {
		case a.At < b.At:
			return -1
		case a.At > b.At:
			return 1
		}
		return 0
	})
}

// Report is the checker's verdict on one quota.
type Report struct {
	Quota    string
	Burst    float64
	Rate     float64
	Admitted float64 // total cost admitted (a repeated request id once)
	Count    int     // admitted records counted
	Repeats  int     // admitted records skipped as repeats of a request id
	// Overshoot is the largest max(level) - Burst over the run (<= 0 when
	// the bound held), and [From, To] the window where it happened: from
	// the last time the level was empty to the admission that peaked.
	Overshoot float64
	From, To  time.Duration
	// First is the time of the first counted admission.
	First time.Duration
	// Slack is Rate x the longest Latency of a counted admission: the
	// most that the uncertainty of the timestamps could explain of
	// Overshoot in any window (shown for reference; Judge uses Certain,
	// which widens each window only by its own admissions' latencies).
	Slack float64
	// Certain is the overshoot that holds wherever in [At - Latency, At]
	// each counted admission was really charged (CertainOvershoot): a
	// lower bound of the true overshoot, and never above Overshoot.
	Certain Certain
	// Utilisation is Admitted / (Burst + Rate * span), span being from the
	// first to the last admission.
	Utilisation float64
	// Refusals judges the other half of the promise: refusals of
	// requests the budget held (refusal.go).
	Refusals Refusals
}

// Check replays the admissions of one quota (records of other quotas are
// skipped; refusals are judged apart, Report.Refusals) through a leaky
// bucket of (burst, rate):
//
//	level = max(0, level - rate*dt) + cost,   overshoot = max(level) - burst
//
// An admitted record whose RequestID was already admitted for the quota
// is a retry answered from the store's record, not a new charge, and is
// skipped (counted in Repeats).
func Check(recs []Record, quota string, burst, rate float64) Report {
	rep := Report{Quota: quota, Burst: burst, Rate: rate, Overshoot: -burst}
	var level float64
	var last, emptySince, first time.Duration
	var maxLat time.Duration
	seen := false
	ids := map[string]bool{}
	var spans []Span
	var adm []Record
	for _, r := range recs {
		if r.Quota != quota || !r.Allowed {
			continue
		}
		if r.RequestID != "" {
			if ids[r.RequestID] {
				rep.Repeats++
				continue
			}
			ids[r.RequestID] = true
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
		rep.Count++
		adm = append(adm, r)
		maxLat = max(maxLat, r.Latency)
		spans = append(spans, Span{From: r.At - r.Latency, To: r.At, Cost: r.Cost})
		if o := level - burst; o > rep.Overshoot {
			rep.Overshoot, rep.From, rep.To = o, emptySince, r.At
		}
	}
	rep.Refusals = refusals(recs, adm, quota, burst, rate)
	rep.Slack = rate * maxLat.Seconds()
	rep.Certain = CertainOvershoot(spans, burst, rate)
	rep.First = first
	if seen {
		if allowed := burst + rate*(last-first).Seconds(); allowed > 0 {
			rep.Utilisation = rep.Admitted / allowed
		}
	}
	return rep
}

// Quota is a quota's shape as recorded with its admissions.
type Quota struct {
	Name        string
	Burst, Rate float64
}

// Quotas lists the quotas in recs, with the shape of their first record,
// sorted by name.
func Quotas(recs []Record) []Quota {
	seen := map[string]bool{}
	var out []Quota
	for _, r := range recs {
		if !seen[r.Quota] {
			seen[r.Quota] = true
			out = append(out, Quota{Name: r.Quota, Burst: r.Burst, Rate: r.Rate})
		}
	}
	slices.SortFunc(out, func(a, b Quota) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// CheckAll checks every quota in recs (sorted by time) against the shape
// recorded with it.
func CheckAll(recs []Record) []Report {
	var out []Report
	for _, q := range Quotas(recs) {
		out = append(out, Check(recs, q.Name, q.Burst, q.Rate))
	}
	return out
}

// Verdict is a report judged against a bound: the overshoot a scenario's
// failure model allows, in tokens (0 for leased quotas and fail_closed).
type Verdict struct {
	Report
	Bound float64
	Pass  bool
}

// Tolerance absorbs float rounding in the replay.
const Tolerance = 1e-6

// Judge passes a report when its certain overshoot (each window widened
// by its own admissions' latencies, not the run's slowest) is within
// bound.
func Judge(rep Report, bound float64) Verdict {
	return Verdict{Report: rep, Bound: bound, Pass: rep.Certain.Overshoot <= bound+Tolerance}
}

// Table formats verdicts, one row per quota, for people. Overshoot is shown
// clamped at 0 (a quota that never filled its burst shows 0); the window is
// in seconds since the quota's first admission.
func Table(vs []Verdict) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-32s %8s %8s %9s %10s %8s %9s %8s %9s %6s  %s\n",
		"quota", "burst", "rate", "admitted", "overshoot", "slack", "bound", "util", "false-ref", "pass", "window")
	for _, v := range vs {
		pass := "ok"
		if !v.Pass {
			pass = "FAIL"
		}
		fmt.Fprintf(&b, "%-32s %8g %8g %9.6g %10.3f %8.3f %9.6g %8.3f %9d %6s  [%.3fs, %.3fs]\n",
			v.Quota, v.Burst, v.Rate, v.Admitted, max(v.Overshoot, 0), v.Slack, v.Bound, v.Utilisation, v.Refusals.False, pass,
			(v.From - v.First).Seconds(), (v.To - v.First).Seconds())
	}
	return b.String()
}
