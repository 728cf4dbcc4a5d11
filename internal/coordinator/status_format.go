package coordinator

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/ration-dev/ration/internal/lease"
)

// FormatNumber writes a rate or an amount for people, as the status page
// does: at most 3 decimals, no exponent.
func FormatNumber(v float64) string { return fmtNum(v) }

// FormatDuration writes d for people, as the status page does: tenths of
// a second below ten seconds, whole seconds below a minute, then the two
// largest units ("3m 12s", "2h 5m", "4d 3h").
func FormatDuration(d time.Duration) string { return fmtDur(d.Seconds()) }

// fmtDur writes a duration in seconds for people: tenths below ten
// seconds, then whole seconds, then the two largest units ("3m 12s",
// "2h 5m", "4d 3h").
func fmtDur(s float64) string {
	neg := ""
	if s < 0 {
		neg, s = "-", -s
	}
	if s < 10 {
		return neg + strconv.FormatFloat(s, 'f', 1, 64) + "s"
	}
	t := int64(s)
	units := []struct {
		n    int64
		name string
	}{{86400, "d"}, {3600, "h"}, {60, "m"}, {1, "s"}}
	for i, u := range units {
		if t < u.n {
			continue
		}
		out := fmt.Sprintf("%s%d%s", neg, t/u.n, u.name)
		if i+1 < len(units) {
			if r := t % u.n / units[i+1].n; r > 0 {
				out += fmt.Sprintf(" %d%s", r, units[i+1].name)
			}
		}
		return out
	}
	return neg + "0s"
}

// chartOf lays out a chart of the samples: admitted and demand against the
// limit, over the samples' span, scaled to the largest value shown.
func chartOf(h []statusSample) *statusChart {
	const w, h0, pad = 600, 120, 2
	// At most one point per two pixels: the page is fetched again every
	// refresh, and finer points would not show.
	if step := (len(h) + w/2 - 1) / (w / 2); step > 1 {
		thin := make([]statusSample, 0, len(h)/step+1)
		for i := 0; i < len(h); i += step {
			thin = append(thin, h[i])
		}
		if thin[len(thin)-1] != h[len(h)-1] {
			thin = append(thin, h[len(h)-1])
		}
		h = thin
	}
	c := &statusChart{W: w, H: h0, Points: len(h)}
	for _, s := range h {
		c.Max = math.Max(c.Max, math.Max(float64(s.limit), math.Max(float64(s.admitted), float64(s.demand))))
	}
	if c.Max <= 0 {
		c.Max = 1
	}
	c.Max *= 1.1 // headroom over the top line
	first, last := h[0].at, h[len(h)-1].at
	span := max(last-first, 1)
	c.Span = fmtDur(float64(span))
	clock := func(unix int64) string { return time.Unix(unix, 0).UTC().Format("15:04:05") }
	c.Start, c.Mid, c.End = clock(first), clock(first+span/2), clock(last)
	line := func(val func(statusSample) float32) string {
		var b strings.Builder
		for i, s := range h {
			x := float64(w) * float64(s.at-first) / float64(span)
			if len(h) == 1 {
				x = w
			}
			y := float64(h0-pad) - float64(h0-2*pad)*float64(val(s))/c.Max
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%.1f,%.1f", x, y)
		}
		return b.String()
	}
	c.Admitted = line(func(s statusSample) float32 { return s.admitted })
	c.Demand = line(func(s statusSample) float32 { return s.demand })
	c.Limit = line(func(s statusSample) float32 { return s.limit })
	c.LastAdmitted, c.LastLimit = float64(h[len(h)-1].admitted), float64(h[len(h)-1].limit)
	return c
}

// fmtNum writes a number for people: at most 3 decimals, no exponent
// below 1e15, "∞"-free (the state holds no infinities).
func fmtNum(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	s := strconv.FormatFloat(v, 'f', 3, 64)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

// lastContactText is raft's last_contact statistic ("never", "0" on a
// leader, or a Go duration) as the page writes durations.
func lastContactText(raw, state string) string {
	if state == "Leader" {
		return "this node leads"
	}
	d, err := time.ParseDuration(raw)
	if err != nil {
		return raw // "never"
	}
	return fmtDur(d.Seconds()) + " ago"
}

func tuningView(t lease.Tuning) statusTuning {
	v := statusTuning{Rule: t.Rule, Region: t.Region}
	set := func(name string, val string) { v.Settings = append(v.Settings, name+"="+val) }
	if t.LeasePeriod != 0 {
		set("lease_period", (time.Duration(t.LeasePeriod) * time.Microsecond).String())
	}
	if t.RenewAt != 0 {
		set("renew_at", fmtNum(t.RenewAt))
	}
	if t.MinSlice != nil {
		set("min_slice", fmtNum(*t.MinSlice)+"/s")
	}
	if t.MaxSlice != nil {
		set("max_slice", fmtNum(*t.MaxSlice)+"/s")
	}
	if t.Weight != 0 {
		set("weight", fmtNum(t.Weight))
	}
	if t.SafeShare != nil {
		set("safe_share", fmtNum(*t.SafeShare)+"/s")
		if t.SafePrev != nil {
			v.Pending = fmt.Sprintf("safe_share %s/s -> %s/s, waiting for the region to confirm", fmtNum(*t.SafePrev), fmtNum(*t.SafeShare))
		}
	}
	return v
}

// serverViews are the configuration's servers with their health as this
// node sees it (health.go).
func (n *Node) serverViews(now time.Time, leaderID string) []statusServer {
	servers, err := n.servers()
	if err != nil {
		return nil
	}
	health := n.memberStatuses(servers)
	out := make([]statusServer, 0, len(servers))
	for i, s := range servers {
		h := health[i]
		sv := statusServer{
			ID: string(s.ID), Address: string(s.Address), Suffrage: s.Suffrage.String(),
			Leader: string(s.ID) == leaderID, Self: string(s.ID) == n.cfg.ID,
			Health: h.Health, ProbeError: h.Error, AppliedIndex: h.Applied, Lag: h.Lag,
			Version: h.Version, Commit: h.Commit, Uptime: h.Uptime.Seconds(),
		}
		if !h.LastContact.IsZero() {
			at := h.LastContact.UTC()
			sv.LastContact, sv.LastContactAgo = &at, max(now.Sub(at).Seconds(), 0)
		}
		out = append(out, sv)
	}
	return out
}
