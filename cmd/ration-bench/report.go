package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is a run's result; -json prints it as is.
type Report struct {
	Mode           string         `json:"mode"`
	Endpoint       string         `json:"endpoint"`
	Targets        []string       `json:"targets"`
	Conns          int            `json:"conns,omitempty"` // gRPC connections
	TLS            string         `json:"tls,omitempty"`   // what the connections negotiated; empty: plaintext
	Loop           string         `json:"loop"`            // closed or open
	Concurrency    int            `json:"concurrency,omitempty"`
	Rate           float64        `json:"rate,omitempty"` // open loop: decisions/s asked for
	MaxOutstanding int            `json:"max_outstanding,omitempty"`
	Batch          int            `json:"batch"` // decisions per call
	Keys           int            `json:"keys"`
	Dist           string         `json:"dist"`
	ZipfS          float64        `json:"zipf_s,omitempty"`
	Rule           string         `json:"rule,omitempty"`
	Mix            []weightedRule `json:"mix,omitempty"`
	DescriptorKey  string         `json:"descriptor_key,omitempty"`
	Cost           float64        `json:"cost"`

	WarmupSeconds   float64 `json:"warmup_s"`
	DurationSeconds float64 `json:"duration_s"`      // asked for (0: until -requests)
	RequestsCap     int64   `json:"requests_cap"`    // 0: none
	ElapsedSeconds  float64 `json:"elapsed_s"`       // measured window: warmup end to last answer
	Interrupted     bool    `json:"interrupted"`     // stopped by a signal
	StartedAt       string  `json:"started_at"`      // RFC 3339
	Calls           int64   `json:"calls"`           // measured calls
	Decisions       int64   `json:"decisions"`       // measured decisions = allowed + denied + errors
	CallsPerSec     float64 `json:"calls_per_s"`     //
	DecisionsPerSec float64 `json:"decisions_per_s"` //

	// DecidedPerSec counts only decisions a rule's bucket made: not errors,
	// not failure-policy answers (reasons unavailable and emergency: the
	// store was unreachable or slower than the agent's -decision-timeout),
	// not requests that matched no rule. It is the throughput to compare.
	DecidedPerSec float64 `json:"decided_per_s"`
	FailurePolicy int64   `json:"failure_policy"` // decisions a failure policy answered
	NoRule        int64   `json:"no_rule"`        // requests that matched no rule (admitted)

	Allowed         int64            `json:"allowed"`
	Denied          int64            `json:"denied"`
	Errors          int64            `json:"errors"`
	AllowedByReason map[string]int64 `json:"allowed_by_reason"`
	DeniedByReason  map[string]int64 `json:"denied_by_reason"`
	ErrorsByReason  map[string]int64 `json:"errors_by_reason"`

	// Latency is per call, in µs; every mode but batch has one decision per
	// call, so it is also per decision. Batch adds Amortized: each call's
	// latency divided by its size, counted once per decision.
	Latency   latencySummary  `json:"latency_us"`
	Amortized *latencySummary `json:"amortized_latency_us,omitempty"`

	OpenLoop *openLoop `json:"open_loop,omitempty"`

	// CPU of -pids during the measured window, and the sum per decision.
	CPU                   []cpuUsage `json:"cpu,omitempty"`
	CPUTotalUSPerDecision float64    `json:"cpu_total_us_per_decision,omitempty"`
	// SelfCPU is this tool's own CPU: it shares the machine with what it
	// measures.
	SelfCPU *cpuUsage `json:"self_cpu,omitempty"`

	Notes []string `json:"notes,omitempty"`
}

// openLoop is the open loop's bookkeeping, in decisions.
type openLoop struct {
	Sent   int64 `json:"sent"`
	Unsent int64 `json:"unsent"` // due before the end but never started: the backlog
}

func newReport(cfg Config, d *dialer) *Report {
	r := &Report{
		Mode:            cfg.Mode,
		Endpoint:        endpoint(cfg),
		Targets:         cfg.Targets,
		Loop:            "closed",
		Batch:           cfg.perCall(),
		Keys:            cfg.Keys,
		Dist:            cfg.Dist,
		Rule:            cfg.Rule,
		Mix:             cfg.Mix,
		Cost:            cfg.Cost,
		WarmupSeconds:   cfg.Warmup.Seconds(),
		DurationSeconds: cfg.Duration.Seconds(),
		RequestsCap:     cfg.Requests,
		Notes:           slices.Clone(d.notes),
		TLS:             d.tls,
	}
	if cfg.Mode == modeHTTP {
		r.Targets = cfg.HTTPTargets
	} else {
		r.Conns = len(d.conns)
	}
	if cfg.Rate > 0 {
		r.Loop, r.Rate, r.MaxOutstanding = "open", cfg.Rate, cfg.MaxOutstanding
	} else {
		r.Concurrency = cfg.Concurrency
	}
	if cfg.Dist == distZipf {
		r.ZipfS = cfg.ZipfS
	}
	if cfg.Rule == "" && len(cfg.Mix) == 0 {
		r.DescriptorKey = cfg.DescriptorKey
	}
	if cfg.Mode == modeEmpty {
		r.Keys, r.Dist, r.Rule, r.Mix, r.DescriptorKey = 0, "", "", nil, ""
	}
	return r
}

// fill adds the measurements.
func (r *Report) fill(t totals, elapsed time.Duration) {
	r.ElapsedSeconds = round3(elapsed.Seconds())
	r.Calls, r.Decisions = t.calls, t.decisions
	if s := elapsed.Seconds(); s > 0 {
		r.CallsPerSec = math.Round(float64(t.calls) / s)
		r.DecisionsPerSec = math.Round(float64(t.decisions) / s)
	}
	r.AllowedByReason, r.DeniedByReason, r.ErrorsByReason = map[string]int64{}, map[string]int64{}, map[string]int64{}
	for k, v := range t.counts {
		switch k.kind {
		case kindAllowed:
			r.Allowed += v
			r.AllowedByReason[k.reason] += v
		case kindDenied:
			r.Denied += v
			r.DeniedByReason[k.reason] += v
		default:
			r.Errors += v
			r.ErrorsByReason[k.reason] += v
		}
	}
	for _, m := range []map[string]int64{r.AllowedByReason, r.DeniedByReason} {
		r.FailurePolicy += m["unavailable"] + m["emergency"]
	}
	r.NoRule = r.AllowedByReason["no_rule"]
	if s := elapsed.Seconds(); s > 0 {
		r.DecidedPerSec = math.Round(float64(r.Decisions-r.Errors-r.FailurePolicy-r.NoRule) / s)
	}
	r.Latency = summarize(t.lat, t.maxLat)
	if t.amort != nil {
		a := summarize(t.amort, t.maxAmort)
		r.Amortized = &a
	}
	if n := r.NoRule; n > 0 && n*2 > r.Decisions {
		r.Notes = append(r.Notes, fmt.Sprintf("%d of %d decisions matched no rule: check -rule, -descriptor-key and the agent's rules", n, r.Decisions))
	}
	if n := r.FailurePolicy; n > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%d of %d decisions (%.1f%%) were answered by a failure policy, not by a bucket: the store was unreachable or slower than the agent's -decision-timeout; decisions/s overstates the throughput, see decided/s",
			n, r.Decisions, 100*float64(n)/float64(r.Decisions)))
	}
	if r.Errors > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%d decisions failed; see errors by reason", r.Errors))
	}
	if r.OpenLoop != nil && r.OpenLoop.Unsent > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("open loop fell behind: %d decisions due in the window never started (the agent did not keep up with -rate %g, or -max-outstanding %d is too low)",
			r.OpenLoop.Unsent, r.Rate, r.MaxOutstanding))
	}
}

func (r *Report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// writeText prints the report for people.
func (r *Report) writeText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	p := func(format string, args ...any) { fmt.Fprintf(tw, format, args...) }

	p("ration-bench\t%s (%s) -> %s\n", r.Mode, r.Endpoint, strings.Join(r.Targets, ", "))
	load := fmt.Sprintf("closed loop, concurrency %d", r.Concurrency)
	if r.Loop == "open" {
		load = fmt.Sprintf("open loop, %s decisions/s asked, at most %d calls in flight", group(int64(r.Rate)), r.MaxOutstanding)
	}
	if r.Conns > 0 {
		load += fmt.Sprintf(", %d gRPC connections", r.Conns)
	}
	p("load\t%s\n", load)
	if r.TLS != "" {
		p("tls\t%s\n", r.TLS)
	}
	if r.Mode != modeEmpty {
		keys := fmt.Sprintf("%s subjects, %s", group(int64(r.Keys)), r.Dist)
		if r.ZipfS > 0 {
			keys += fmt.Sprintf(" (s=%g)", r.ZipfS)
		}
		switch {
		case r.Rule != "":
			keys += ", rule " + r.Rule
		case len(r.Mix) > 0:
			var parts []string
			for _, m := range r.Mix {
				parts = append(parts, fmt.Sprintf("%s:%g", m.Rule, m.Weight))
			}
			keys += ", mix " + strings.Join(parts, ",")
		default:
			keys += ", descriptor " + r.DescriptorKey + "=<subject>"
		}
		if r.Batch > 1 {
			keys += fmt.Sprintf(", %d per call", r.Batch)
		}
		p("keys\t%s\n", keys)
	}
	window := fmt.Sprintf("%.3fs after %gs warmup", r.ElapsedSeconds, r.WarmupSeconds)
	if r.Interrupted {
		window += " (interrupted)"
	}
	p("measured\t%s\n", window)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	p("decisions\t%s\t%s/s\n", group(r.Decisions), group(int64(r.DecisionsPerSec)))
	if r.Mode != modeEmpty {
		p("decided\t%s/s\tby a bucket (not errors, failure policy or no rule)\n", group(int64(r.DecidedPerSec)))
	}
	if r.Batch > 1 {
		p("calls\t%s\t%s/s\n", group(r.Calls), group(int64(r.CallsPerSec)))
	}
	p("allowed\t%s\t%s\n", group(r.Allowed), byReason(r.AllowedByReason))
	p("denied\t%s\t%s\n", group(r.Denied), byReason(r.DeniedByReason))
	p("errors\t%s\t%s\n", group(r.Errors), byReason(r.ErrorsByReason))
	if r.OpenLoop != nil {
		p("unsent\t%s\tdue in the window but never started (open loop; %s sent)\n", group(r.OpenLoop.Unsent), group(r.OpenLoop.Sent))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)

	tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	p = func(format string, args ...any) { fmt.Fprintf(tw, format, args...) }
	p("latency µs\tp50\tp90\tp95\tp99\tp99.9\tmax\tmean\t\n")
	row := func(name string, l latencySummary) {
		p("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", name, us(l.P50), us(l.P90), us(l.P95), us(l.P99), us(l.P999), us(l.Max), us(l.Mean))
	}
	if r.Amortized != nil {
		row(fmt.Sprintf("per call (%d decisions)", r.Batch), r.Latency)
		row("per decision (amortized)", *r.Amortized)
	} else {
		row("per decision", r.Latency)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if len(r.CPU) > 0 || r.SelfCPU != nil {
		tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		p = func(format string, args ...any) { fmt.Fprintf(tw, format, args...) }
		fmt.Fprintln(w)
		p("CPU in the window\tpid\tseconds\tµs/decision\n")
		for _, c := range r.CPU {
			if c.Error != "" {
				p("%s\t%d\t%s\t\n", cmp.Or(c.Name, "?"), c.PID, c.Error)
				continue
			}
			p("%s\t%d\t%.2f\t%.1f\n", c.Name, c.PID, c.Seconds, c.USPerDecision)
		}
		if len(r.CPU) > 0 {
			p("total of -pids\t\t\t%.1f\n", r.CPUTotalUSPerDecision)
		}
		if c := r.SelfCPU; c != nil {
			p("%s\t%d\t%.2f\t%.1f\n", c.Name, c.PID, c.Seconds, c.USPerDecision)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, n := range r.Notes {
		if _, err := fmt.Fprintf(w, "note: %s\n", n); err != nil {
			return err
		}
	}
	return nil
}

// byReason lists counts biggest first: "ok 120, shadow 3".
func byReason(m map[string]int64) string {
	keys := slices.SortedFunc(maps.Keys(m), func(a, b string) int {
		return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b))
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + " " + group(m[k])
	}
	return strings.Join(parts, ", ")
}

// group writes n with thousands separators: 1,234,567.
func group(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func us(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// fmtMicros prints a latency in the unit that reads best.
func fmtMicros(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', 2, 64) + "s"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', 2, 64) + "ms"
	default:
		return strconv.FormatFloat(v, 'f', 0, 64) + "µs"
	}
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }
func round3(v float64) float64 { return math.Round(v*1000) / 1000 }
