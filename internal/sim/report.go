package sim

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// recorder holds every key's admitted and offered decisions per step.
type recorder struct {
	admitted, demand [][]int32
}

func newRecorder(keys, steps int) *recorder {
	r := &recorder{admitted: make([][]int32, keys), demand: make([][]int32, keys)}
	for k := range r.admitted {
		r.admitted[k] = make([]int32, steps)
		r.demand[k] = make([]int32, steps)
	}
	return r
}

// loadSeries is one group's load per second of simulated time. bytes is
// the applier's (it encodes the commands it applies); the rest the loop's.
type loadSeries struct {
	requests, items, entries, bytes []int64
}

func newLoad(secs int) *loadSeries {
	return &loadSeries{requests: make([]int64, secs), items: make([]int64, secs), entries: make([]int64, secs), bytes: make([]int64, secs)}
}

func (l *loadSeries) sec(s *Sim) int { return min(int(s.now/1e6), len(l.requests)-1) }

func (l *loadSeries) request(s *Sim, items int) {
	i := l.sec(s)
	l.requests[i]++
	l.items[i] += int64(items)
}

// QuotaResult is one quota's judgement.
type QuotaResult struct {
	ID          string
	Burst, Rate float64
	Admitted    int64
	Demand      int64
	// Excess is the largest amount by which admissions over any window
	// [t0, t1] exceeded B + r(1+rho)(t1-t0), with rho the coordinators'
	// clock drift bound (0 when within); RawExcess the same against
	// B + r(t1-t0).
	Excess, RawExcess float64
	// Utilisation is admitted / min(demand, r) over the steady seconds
	// (after the warm-up, outside faults and one lease period after them);
	// NaN when none had demand.
	Utilisation float64
	// FalseRefusals counts the refusals an exact token bucket of (B, r),
	// fed the quota's admissions, would have admitted (falseRefusals);
	// SteadyFalse those of them in steady seconds.
	FalseRefusals, SteadyFalse int64
	// Short is what an exact token bucket of (B, r) fed the quota's
	// demand would have admitted, less what was admitted: the budget the
	// system left unspent where callers asked for it (negative: it
	// admitted more, within the bound's allowances).
	Short int64
}

// Shift is the time a quota took to follow a demand change.
type Shift struct {
	Fault, Edge, Quota string
	// Follow is the time from the change to the first second in which
	// admitted reached 0.9 of min(demand, rate); negative: not within the
	// change's span.
	Follow time.Duration
}

// GroupLoad is one coordinator group's load.
type GroupLoad struct {
	Name                                         string
	RequestsPerSec, ItemsPerSec, EntriesPerSec   float64
	BytesPerSec                                  float64
	PeakRequests, PeakItems, PeakEntries, PeakBy int64
}

// Report is a run's result. Text prints it; the same seed prints the same
// text apart from the line that says how long the run took.
type Report struct {
	Config  Config
	Quotas  []QuotaResult
	Shifts  []Shift
	Load    []GroupLoad
	Events  []string
	Fails   []string
	NFails  int
	Stats   stats
	Elapsed time.Duration

	sim *Sim
}

// OK reports whether every invariant held: no state invariant broken, no
// overshoot beyond the bound on any leased quota.
func (r *Report) OK() bool {
	if r.NFails > 0 {
		return false
	}
	for _, q := range r.Quotas {
		if q.Excess > 0 {
			return false
		}
	}
	return true
}

func (s *Sim) report() *Report {
	r := &Report{Config: s.cfg, Events: s.log, Fails: s.fails, NFails: s.nfails, Stats: s.stats, Elapsed: time.Since(s.started), sim: s}
	step := us(s.cfg.Step)
	perSec := int(1e6 / step)
	steps := int(s.end/step) + 1
	// Steady seconds: after the warm-up, outside every fault and a lease
	// period after it.
	secs := steps / perSec
	steady := make([]bool, secs)
	for i := range steady {
		t := int64(i) * 1e6
		steady[i] = t >= us(s.cfg.Warmup)
		for _, f := range s.faults {
			if t+1e6 > f.from && t < f.to+us(s.cfg.LeasePeriod) {
				steady[i] = false
			}
		}
	}
	rho := s.cfg.CoordDrift
	for _, sp := range s.keys {
		if sp.rate == 0 {
			continue
		}
		adm, dem := s.rec.admitted[sp.key], s.rec.demand[sp.key]
		q := QuotaResult{ID: sp.id, Burst: sp.burst, Rate: sp.rate}
		q.Excess = excess(adm, step, sp.burst, sp.rate*(1+rho))
		q.RawExcess = excess(adm, step, sp.burst, sp.rate)
		var num, den float64
		for i := 0; i < secs; i++ {
			var a, d int64
			for k := i * perSec; k < (i+1)*perSec && k < steps; k++ {
				a += int64(adm[k])
				d += int64(dem[k])
			}
			q.Admitted += a
			q.Demand += d
			if steady[i] {
				num += float64(a)
				den += min(float64(d), sp.rate)
			}
		}
		q.FalseRefusals, q.SteadyFalse = falseRefusals(adm, dem, step, sp.burst, sp.rate, func(k int) bool {
			i := k / perSec
			return i < secs && steady[i]
		})
		q.Short = exactAdmits(dem, step, sp.burst, sp.rate) - q.Admitted
		q.Utilisation = math.NaN()
		if den > 0 {
			q.Utilisation = num / den
		}
		r.Quotas = append(r.Quotas, q)
	}
	for _, f := range s.faults {
		for _, key := range f.shift {
			sp := s.keys[key]
			for _, edge := range []struct {
				name     string
				from, to int64
			}{{"start", f.from, f.to}, {"end", f.to, min(f.to+(f.to-f.from), s.end)}} {
				r.Shifts = append(r.Shifts, Shift{Fault: f.name, Edge: edge.name, Quota: sp.id, Follow: s.follow(sp, edge.from, edge.to)})
			}
		}
	}
	for _, f := range s.faults {
		if f.darkRegion < 0 {
			continue
		}
		q := ruleGlobal + "| upstream " + s.regionName(f.darkRegion)
		r.Shifts = append(r.Shifts,
			Shift{Fault: f.name, Edge: "start", Quota: q, Follow: s.shareFollow(f.darkRegion, f.from, f.to, false)},
			Shift{Fault: f.name, Edge: "end", Quota: q, Follow: s.shareFollow(f.darkRegion, f.to, min(f.to+(f.to-f.from), s.end), true)})
	}
	for _, g := range s.groups {
		gl := GroupLoad{Name: g.name}
		n := float64(len(g.load.requests))
		for i := range g.load.requests {
			gl.RequestsPerSec += float64(g.load.requests[i]) / n
			gl.ItemsPerSec += float64(g.load.items[i]) / n
			gl.EntriesPerSec += float64(g.load.entries[i]) / n
			gl.BytesPerSec += float64(g.load.bytes[i]) / n
			gl.PeakRequests = max(gl.PeakRequests, g.load.requests[i])
			gl.PeakItems = max(gl.PeakItems, g.load.items[i])
			gl.PeakEntries = max(gl.PeakEntries, g.load.entries[i])
			gl.PeakBy = max(gl.PeakBy, g.load.bytes[i])
		}
		r.Load = append(r.Load, gl)
	}
	return r
}

// falseRefusals is the second judge on one quota's steps: a refusal
// (demand not admitted) is false when an exact token bucket of (b, rate),
// fed the admissions adm, had room for it. The simulator knows a step's
// counts, not their order within it, so the judge is lenient: it holds a
// step's refusals to the room left after all of the step's admissions,
// and counts at most that room (each refusal costs 1), never every
// refusal of a caller asking far beyond its rate. It returns the count,
// and the count in the steps steady reports true for.
func falseRefusals(adm, dem []int32, step int64, b, rate float64, steady func(k int) bool) (all, inSteady int64) {
	var level float64
	drain := rate * float64(step) / 1e6
	for k, a := range adm {
		level = max(0, level-drain) + float64(a)
		refused := int64(dem[k]) - int64(a)
		if refused <= 0 {
			continue
		}
		room := math.Floor(b - level + 1e-9)
		if room < 1 {
			continue
		}
		n := min(refused, int64(room))
		all += n
		if steady(k) {
			inSteady += n
		}
	}
	return all, inSteady
}

// exactAdmits is what an exact token bucket of (b, rate), full at the
// start, admits of the demand dem (one count per step, each request of
// cost 1).
func exactAdmits(dem []int32, step int64, b, rate float64) int64 {
	tokens := b
	refill := rate * float64(step) / 1e6
	var n int64
	for _, d := range dem {
		tokens = min(b, tokens+refill)
		a := min(int64(d), int64(tokens+1e-9))
		tokens -= float64(a)
		n += a
	}
	return n
}

// excess is the largest amount by which the admissions adm (one count per
// step, each at its step's instant) exceed b + rate*(t1-t0) over any
// window of instants [t0, t1]: max over j of (P_j - rate t_j) minus the
// least (P_{i-1} - rate t_i) for i <= j, less b.
func excess(adm []int32, step int64, b, rate float64) float64 {
	var p float64
	lo := math.Inf(1)
	worst := 0.0
	for j, a := range adm {
		t := float64(int64(j)*step) / 1e6
		lo = math.Min(lo, p-rate*t) // P_{j-1} - r t_j
		p += float64(a)
		if e := p - rate*t - lo - b; e > worst {
			worst = e
		}
	}
	// Float sums of integers up to 2^53 are exact; the bound is not:
	// forgive rounding.
	if worst <= 1e-9*(b+rate*float64(int64(len(adm))*step)/1e6) {
		return 0
	}
	return worst
}

// follow is how long after from the quota's admissions first reached 0.9
// of min(demand, rate) in a one-second window starting within [from, to).
func (s *Sim) follow(sp *spec, from, to int64) time.Duration {
	step := us(s.cfg.Step)
	perSec := int(1e6 / step)
	adm, dem := s.rec.admitted[sp.key], s.rec.demand[sp.key]
	for k := int(from / step); int64(k)*step < to && k+perSec <= len(adm); k++ {
		var a, d float64
		for i := k; i < k+perSec; i++ {
			a += float64(adm[i])
			d += float64(dem[i])
		}
		if want := math.Min(d, sp.rate); want > 0 && a >= 0.9*want {
			return time.Duration(int64(k)*step-from) * time.Microsecond
		}
	}
	return -1
}

// shareFollow is how long after from region reg's upstream lease of the
// global rule fell below a tenth of its rate at from (back: came back to
// 0.9 of its rate just before the region went dark), sampled each second;
// -1 when not within [from, to).
func (s *Sim) shareFollow(reg int, from, to int64, back bool) time.Duration {
	rates := s.upRates[reg]
	i0 := int(from / 1e6)
	if i0 < 1 || i0 >= len(rates) {
		return -1
	}
	ref := rates[i0-1]
	if back {
		ref = s.darkRef[reg]
	}
	for i := i0; i < len(rates) && int64(i)*1e6 < to; i++ {
		if (!back && rates[i] <= 0.1*ref) || (back && rates[i] >= 0.9*ref) {
			return time.Duration(int64(i)*1e6-from) * time.Microsecond
		}
	}
	return -1
}

// Text writes the report.
func (r *Report) Text(w io.Writer) {
	c := r.Config
	var b strings.Builder
	fmt.Fprintf(&b, "ration-sim %s, seed %d: %d regions x %d agents = %d agents, %v simulated, %.0f decisions/s on average\n",
		c.Name, c.Seed, c.Regions, c.AgentsPerRegion, c.Regions*c.AgentsPerRegion, c.Duration, c.Rate)
	fmt.Fprintf(&b, "decisions %d, admitted %d (%.4f); messages %d (lost %d, cut %d, duplicated %d); holder rounds %d; nudge messages %d; elections %d (lost-term entries committed by the next leader %d, gone %d); agent crashes %d\n",
		r.Stats.decisions, r.Stats.admitted, float64(r.Stats.admitted)/math.Max(1, float64(r.Stats.decisions)),
		r.Stats.messages, r.Stats.lost, r.Stats.cut, r.Stats.duplicated, r.Stats.rounds, r.Stats.nudges, r.Stats.elections, r.Stats.lostCommitted, r.Stats.lostDropped, r.Stats.crashes)
	verdict := "PASS"
	if !r.OK() {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "verdict: %s (%d invariant failures)\n\n", verdict, r.NFails)

	fmt.Fprintf(&b, "quotas (overshoot: admitted above B + r(1+rho)T over the worst window, rho = %g; raw: above B + rT;\n", c.CoordDrift)
	fmt.Fprintf(&b, "false-ref: refusals an exact bucket of (B, r) fed the admissions would have admitted, all / in steady seconds;\n")
	fmt.Fprintf(&b, "short: what an exact bucket fed the demand would have admitted, less what was):\n")
	fmt.Fprintf(&b, "  %-22s %12s %12s %12s %12s %10s %10s %8s %16s %8s\n", "quota", "B", "r/s", "admitted", "demand", "overshoot", "raw", "util", "false-ref", "short")
	for _, q := range r.Quotas {
		fmt.Fprintf(&b, "  %-22s %12.1f %12.1f %12d %12d %10.1f %10.1f %8s %16s %8d\n", q.ID, q.Burst, q.Rate, q.Admitted, q.Demand, q.Excess, q.RawExcess, fmtUtil(q.Utilisation),
			fmt.Sprintf("%d / %d", q.FalseRefusals, q.SteadyFalse), q.Short)
	}
	fmt.Fprintf(&b, "\nutilisation in steady state (goal >= 0.95): %s\n", r.utilSummary())
	fmt.Fprintf(&b, "\ndemand shifts (a quota: time until admitted >= 0.9 min(demand, r) in a 1s window; an upstream share:\ntime until the dark region's lease of the global rule is below 0.1 of its rate, then back to 0.9, sampled each second):\n")
	for _, sh := range r.Shifts {
		f := "not reached within the span"
		if sh.Follow >= 0 {
			f = sh.Follow.String()
		}
		fmt.Fprintf(&b, "  %-28s %-6s %-28s %s\n", sh.Fault, sh.Edge, sh.Quota, f)
	}
	fmt.Fprintf(&b, "\ncoordinator load (mean over the run; peak second):\n")
	fmt.Fprintf(&b, "  %-12s %12s %12s %12s %12s %10s %10s %10s\n", "group", "requests/s", "items/s", "entries/s", "bytes/s", "peak req", "peak items", "peak B/s")
	for _, g := range r.Load {
		fmt.Fprintf(&b, "  %-12s %12.1f %12.1f %12.1f %12.0f %10d %10d %10d\n", g.Name, g.RequestsPerSec, g.ItemsPerSec, g.EntriesPerSec, g.BytesPerSec, g.PeakRequests, g.PeakItems, g.PeakBy)
	}
	fmt.Fprintf(&b, "\nevents:\n")
	for _, e := range r.Events {
		fmt.Fprintf(&b, "  %s\n", e)
	}
	if len(r.Fails) > 0 {
		fmt.Fprintf(&b, "\ninvariant failures (first %d of %d):\n", len(r.Fails), r.NFails)
		for _, f := range r.Fails {
			fmt.Fprintf(&b, "  %s\n", f)
		}
	}
	var flags string
	if !c.Faults {
		flags += " -faults=false"
	}
	if c.Nudges {
		flags += " -nudges"
	}
	fmt.Fprintf(&b, "\nreplay: go run ./cmd/ration-sim -config %s -seed %d%s\n", c.Name, c.Seed, flags)
	io.WriteString(w, b.String())
}

// Timing is the one line that differs between two runs of one seed.
func (r *Report) Timing() string {
	return fmt.Sprintf("wall clock %v (%.0f decisions per wall-clock second)", r.Elapsed.Round(time.Millisecond), float64(r.Stats.decisions)/r.Elapsed.Seconds())
}

func fmtUtil(u float64) string {
	if math.IsNaN(u) {
		return "-"
	}
	return fmt.Sprintf("%.3f", u)
}

// utilSummary is the least and the demand-weighted utilisation over the
// quotas that had steady demand.
func (r *Report) utilSummary() string {
	least, leastID := math.Inf(1), ""
	var num, den float64
	for _, q := range r.Quotas {
		if math.IsNaN(q.Utilisation) {
			continue
		}
		if q.Utilisation < least {
			least, leastID = q.Utilisation, q.ID
		}
		w := math.Min(float64(q.Demand), q.Rate*r.Config.Duration.Seconds())
		num += q.Utilisation * w
		den += w
	}
	if den == 0 {
		return "no steady demand"
	}
	return fmt.Sprintf("weighted %.3f, least %.3f (%s)", num/den, least, leastID)
}
