package region

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// MaxIDLen bounds a region ID; it appears in holder names and metric labels.
const MaxIDLen = 32

// MaxRegions bounds the regions one rule may name.
const MaxRegions = 64

// ID names a region: [a-z0-9][a-z0-9_-]{0,31}.
type ID string

// Check returns "" for a valid ID, else why not.
func (id ID) Check() string {
	s := string(id)
	if s == "" {
		return "must not be empty"
	}
	if len(s) > MaxIDLen {
		return fmt.Sprintf("is %d bytes, at most %d", len(s), MaxIDLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && (c == '_' || c == '-')) {
			return fmt.Sprintf("%q must match [a-z0-9][a-z0-9_-]{0,31}", s)
		}
	}
	return ""
}

// Region is one deployment region: its own Redis primary, its own
// coordinator group, and its agents.
type Region struct {
	ID           ID
	Redis        string   // the region's Redis primary (host:port)
	Coordinators []string // gRPC addresses of the region's coordinator group
	Agents       []string // agent ids (or addresses) running in the region
}

// Scope says how far a rule's number reaches.
type Scope int

const (
	// ScopeRegion: each region enforces the whole rule on its own. It is the
	// zero value because it is the default in the rules file.
	ScopeRegion Scope = iota
	// ScopeGlobal: one number for all regions together.
	ScopeGlobal
)

// ScopeNames are the names used in the rules file, by value.
var ScopeNames = []string{ScopeRegion: "region", ScopeGlobal: "global"}

func (s Scope) String() string {
	if s >= 0 && int(s) < len(ScopeNames) {
		return ScopeNames[s]
	}
	return fmt.Sprintf("Scope(%d)", int(s))
}

// Weight is one region's part in a global rule.
type Weight struct {
	// Weight is the region's share of a split (mode redis) and its fairness
	// weight between regions (mode leased). > 0.
	Weight float64
	// SafeShare is the rate, in tokens per second, a region cut off from the
	// global group may still admit (mode leased only), with the same fraction
	// of the burst. >= 0.
	SafeShare float64
}

// Share is a part of a rule's (burst, rate).
type Share struct{ Burst, Rate float64 }

// Enforcement is how a region enforces a rule.
type Enforcement int

const (
	// Local: the region enforces the whole rule itself.
	Local Enforcement = iota
	// Split: the region enforces its weighted share in its own Redis.
	Split
	// Hierarchical: the region's coordinators hold a lease from the global
	// group and sublease it to the region's agents.
	Hierarchical
)

func (e Enforcement) String() string {
	switch e {
	case Local:
		return "local"
	case Split:
		return "split"
	case Hierarchical:
		return "hierarchical"
	}
	return fmt.Sprintf("Enforcement(%d)", int(e))
}

// Enforce maps a rule's scope and mode onto how each region enforces it.
func Enforce(s Scope, leased bool) Enforcement {
	switch {
	case s != ScopeGlobal:
		return Local
	case leased:
		return Hierarchical
	}
	return Split
}

// Splits divides (burst, rate) across the regions by weight: region i gets
// (burst*w_i/W, rate*w_i/W). Weights must be > 0.
func Splits(burst, rate float64, ws map[ID]Weight) map[ID]Share {
	var total float64
	for _, id := range slices.Sorted(maps.Keys(ws)) {
		total += ws[id].Weight
	}
	out := make(map[ID]Share, len(ws))
	if !(total > 0) {
		return out
	}
	for id, w := range ws {
		f := w.Weight / total
		out[id] = Share{Burst: burst * f, Rate: rate * f}
	}
	return out
}

// Safe returns a region's safe share of a rule (burst, rate): the rate
// safeShare and the same fraction of the burst. A rule that never refills
// (rate 0) has no safe share.
func Safe(burst, rate, safeShare float64) Share {
	if !(rate > 0) || !(safeShare > 0) {
		return Share{}
	}
	return Share{Burst: burst * math.Min(1, safeShare/rate), Rate: safeShare}
}

// SafeTotal sums the safe shares of every region.
func SafeTotal(burst, rate float64, ws map[ID]Weight) Share {
	var t Share
	for _, id := range slices.Sorted(maps.Keys(ws)) {
		s := Safe(burst, rate, ws[id].SafeShare)
		t.Burst += s.Burst
		t.Rate += s.Rate
	}
	return t
}

// Overshoot is the worst-case excess over the global bound B + r*T that
// safe shares allow while every region is cut off from the global group
// for T: Burst + Rate*T. It is zero when sum(safe) <= r.
func Overshoot(burst, rate float64, ws map[ID]Weight) Share {
	t := SafeTotal(burst, rate, ws)
	return Share{Burst: math.Max(0, t.Burst-burst), Rate: math.Max(0, t.Rate-rate)}
}

// Leasable is what the global group leases out: (B, r) less every region's
// safe share, never negative.
func Leasable(burst, rate float64, ws map[ID]Weight) Share {
	t := SafeTotal(burst, rate, ws)
	return Share{Burst: math.Max(0, burst-t.Burst), Rate: math.Max(0, rate-t.Rate)}
}

// HolderName is the name a regional coordinator group holds its upstream
// leases under.
func HolderName(id ID) string { return "region/" + string(id) }

// FromHolder returns the region of a holder name made by HolderName.
func FromHolder(holder string) (ID, bool) {
	s, ok := strings.CutPrefix(holder, "region/")
	return ID(s), ok && ID(s).Check() == ""
}
