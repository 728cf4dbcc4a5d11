package sim

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// series is one line of a panel.
type series struct {
	name  string
	color string
	ys    []float64
	dash  bool
}

type panel struct {
	title string
	lines []series
}

// perSecond sums a key's per-step counts into per-second ones.
func (s *Sim) perSecond(counts []int32) []float64 {
	perSec := int(1e6 / us(s.cfg.Step))
	out := make([]float64, len(counts)/perSec)
	for i := range out {
		for k := i * perSec; k < (i+1)*perSec; k++ {
			out[i] += float64(counts[k])
		}
	}
	return out
}

func flat(v float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// AdmittedSVG plots admitted against the limit over time: the global
// rule, then each region's own rule and its part of the global one.
func (r *Report) AdmittedSVG(w io.Writer) error {
	s := r.sim
	var ps []panel
	g := s.specs[ruleGlobal+"|"]
	ga := s.perSecond(s.rec.admitted[g.key])
	ps = append(ps, panel{title: "global-api, all regions", lines: []series{
		{"demand", "#bbbbbb", s.perSecond(s.rec.demand[g.key]), false},
		{"limit r", "#d62728", flat(g.rate, len(ga)), true},
		{"admitted", "#1f77b4", ga, false},
	}})
	for reg := 0; reg < s.cfg.Regions; reg++ {
		rs := s.specs[ruleRegional+"|"+s.regionName(reg)]
		ra := s.perSecond(s.rec.admitted[rs.key])
		ps = append(ps, panel{title: "region " + s.regionName(reg), lines: []series{
			{"regional-api demand", "#bbbbbb", s.perSecond(s.rec.demand[rs.key]), false},
			{"regional-api limit", "#d62728", flat(rs.rate, len(ra)), true},
			{"regional-api admitted", "#1f77b4", ra, false},
			{"global-api admitted here", "#2ca02c", s.perSecond(s.rec.admitted[s.regionKey(reg)]), false},
		}})
	}
	return svg(w, fmt.Sprintf("Admitted vs limit per second (%s, seed %d)", r.Config.Name, r.Config.Seed), ps, 3)
}

// LoadSVG plots each coordinator group's renew items and Raft entries per
// second.
func (r *Report) LoadSVG(w io.Writer) error {
	s := r.sim
	items, entries := panel{title: "lease items per second"}, panel{title: "Raft entries per second"}
	for i, g := range s.groups {
		c, name := "#9ecae1", ""
		switch i {
		case 0:
			c, name = "#d62728", "global group"
		case 1:
			name = "regional groups (one line each)"
		}
		f := func(v []int64) []float64 {
			out := make([]float64, len(v))
			for i, x := range v {
				out[i] = float64(x)
			}
			return out
		}
		items.lines = append(items.lines, series{name, c, f(g.load.items), i == 0})
		entries.lines = append(entries.lines, series{name, c, f(g.load.entries), i == 0})
	}
	return svg(w, fmt.Sprintf("Coordinator load (%s, seed %d; dashed: the global group)", r.Config.Name, r.Config.Seed), []panel{items, entries}, 1)
}

// svg draws panels in a grid of cols columns: axes, a y scale, lines, and
// a legend per panel.
func svg(w io.Writer, title string, ps []panel, cols int) error {
	const pw, ph, pad, top = 420, 215, 48, 40
	rows := (len(ps) + cols - 1) / cols
	W, H := cols*pw, top+rows*ph
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="10">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/><text x="10" y="22" font-size="14">%s</text>`+"\n", W, H, esc(title))
	for i, p := range ps {
		x0, y0 := (i%cols)*pw+pad, top+(i/cols)*ph+18
		iw, ih := pw-pad-12, ph-48
		// At most maxPoints per line: the mean of each run of k seconds
		// (a 10-minute run would otherwise write 600 points per line).
		secs := 0
		for j := range p.lines {
			secs = max(secs, len(p.lines[j].ys))
			p.lines[j].ys = thin(p.lines[j].ys, maxPoints)
		}
		ymax, n := 0.0, 0
		for _, l := range p.lines {
			for _, y := range l.ys {
				ymax = math.Max(ymax, y)
			}
			n = max(n, len(l.ys))
		}
		if ymax == 0 {
			ymax = 1
		}
		ymax *= 1.1
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11">%s</text>`+"\n", x0, y0-6, esc(p.title))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", x0, y0, iw, ih)
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text><text x="%d" y="%d" text-anchor="end">0</text>`+"\n", x0-3, y0+8, human(ymax), x0-3, y0+ih)
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%ds</text>`+"\n", x0+iw, y0+ih+12, secs)
		for _, l := range p.lines {
			if len(l.ys) == 0 {
				continue
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1"`, l.color)
			if l.dash {
				b.WriteString(` stroke-dasharray="4,3"`)
			}
			b.WriteString(` points="`)
			for j, y := range l.ys {
				fmt.Fprintf(&b, "%.1f,%.1f ", float64(x0)+float64(j)*float64(iw)/float64(max(1, n-1)), float64(y0+ih)-y/ymax*float64(ih))
			}
			b.WriteString(`"/>` + "\n")
		}
		for j, l := range p.lines {
			if l.name == "" {
				continue
			}
			lx, ly := x0+(j%2)*(iw/2), y0+ih+22+(j/2)*11
			fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s"/><text x="%d" y="%d">%s</text>`+"\n", lx, ly-3, lx+14, ly-3, l.color, lx+18, ly, esc(l.name))
		}
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

const maxPoints = 200

// thin averages ys down to at most max points.
func thin(ys []float64, max int) []float64 {
	k := (len(ys) + max - 1) / max
	if k <= 1 {
		return ys
	}
	out := make([]float64, 0, len(ys)/k+1)
	for i := 0; i < len(ys); i += k {
		sum, n := 0.0, 0
		for j := i; j < i+k && j < len(ys); j++ {
			sum += ys[j]
			n++
		}
		out = append(out, sum/float64(n))
	}
	return out
}

func human(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
