package rules

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ration-dev/ration/internal/region"
)

// Defaults of a mode auto rule's auto block.
const (
	// DefaultPromoteAbove is the decision rate (per second, across every
	// agent of a region) at which a subject is promoted to leases. A
	// subject this busy costs its Redis shard a few percent of a core
	// (docs/capacity.md); far below it, a lease's round trips and memory
	// cost more than the Redis decisions they save.
	DefaultPromoteAbove = 1000
	// DefaultHold is how long one promotion mark lasts unless extended.
	DefaultHold = 2 * time.Second
	// MinHold keeps a hold above a few mark rounds (agents extend every
	// HoldMarkEvery of it), so that one late round trip does not end a
	// promotion.
	MinHold = 200 * time.Millisecond
	// MaxHold bounds a hold: a promoted subject whose agents have all gone
	// stays off Redis (and off every lease) for up to a hold.
	MaxHold = time.Minute
	// HotTau is the time constant of the rate estimate that decides
	// promotion: a subject that jumps to twice the threshold is promoted
	// after about HotTau*ln 2 (0.7s).
	HotTau = time.Second
)

// Auto tunes a mode auto rule: when a subject moves from Redis to leases
// and back. Thresholds are decisions per second across every agent of a
// region (one Redis), measured where every decision passes: the subject's
// Redis bucket while it is there, the agents' mark reports while it is
// leased.
type Auto struct {
	// PromoteAbove: a subject at or above this rate is promoted.
	PromoteAbove float64
	// DemoteBelow: a promoted subject below it is demoted. At most
	// PromoteAbove; the gap keeps a subject near the threshold from
	// flapping. Default PromoteAbove/4.
	DemoteBelow float64
	// Hold is how long a promotion lasts unless agents extend it: their
	// time to obtain leases after a promotion, and how long a subject
	// whose agents all stopped stays off Redis.
	Hold time.Duration
	// Regions overrides the thresholds in some regions.
	Regions map[region.ID]AutoThresholds
}

// AutoThresholds is one region's override of an auto block's thresholds.
type AutoThresholds struct {
	PromoteAbove, DemoteBelow float64
}

// Thresholds returns the promote and demote rates in region id.
func (a Auto) Thresholds(id region.ID) (promote, demote float64) {
	promote, demote = a.PromoteAbove, a.DemoteBelow
	if t, ok := a.Regions[id]; ok {
		promote, demote = t.PromoteAbove, t.DemoteBelow
	}
	return promote, demote
}

// defaultAuto fills what an auto block leaves out.
func defaultAuto(a *Auto, seen map[string]bool) {
	if !seen["auto.promote_above"] {
		a.PromoteAbove = DefaultPromoteAbove
	}
	if !seen["auto.demote_below"] {
		a.DemoteBelow = a.PromoteAbove / 4
	}
	if !seen["auto.hold"] {
		a.Hold = DefaultHold
	}
}

// validateAuto checks a mode auto rule's own constraints (its lease block
// is checked as a leased rule's).
func (r *Rule) validateAuto(add func(field, format string, args ...any)) {
	if r.Mode != ModeAuto {
		if !r.Auto.zero() {
			add("auto", "is set, but mode is %v: it would never be used; remove it or set mode: auto", r.Mode)
		}
		return
	}
	if r.Rate <= 0 && checkRange(r.Rate, true) == "" {
		add("rate", "must be > 0 with mode auto: a promoted subject's lease starts empty and only refills")
	}
	if r.Scope == region.ScopeGlobal {
		add("scope", "global is not supported with mode auto: a global quota is leased from the global group already; use mode: leased")
	}
	if r.Lease.DefaultShare != 0 {
		add("lease.default_share", "is not supported with mode auto: a subject is on leases only while it is hot")
	}
	a := r.Auto
	checkPair := func(field string, promote, demote float64) {
		switch {
		case !(promote > 0) || promote > MaxValue:
			add(field+"promote_above", "must be in (0, %g] decisions/s, got %s", float64(MaxValue), fmtFloat(promote))
		case !(demote >= 0) || demote > promote:
			add(field+"demote_below", "must be in [0, promote_above %s] decisions/s, got %s", fmtFloat(promote), fmtFloat(demote))
		}
	}
	checkPair("auto.", a.PromoteAbove, a.DemoteBelow)
	if a.Hold < MinHold || a.Hold > MaxHold {
		add("auto.hold", "must be in [%v, %v], got %v", MinHold, MaxHold, a.Hold)
	}
	for _, id := range slices.Sorted(maps.Keys(a.Regions)) {
		f := "auto.regions." + string(id) + "."
		if id.Check() != "" {
			f = "auto.regions[" + strconv.Quote(string(id)) + "]."
			add(f[:len(f)-1], "%s", id.Check())
			continue
		}
		t := a.Regions[id]
		checkPair(f, t.PromoteAbove, t.DemoteBelow)
	}
}

func (a Auto) zero() bool {
	return a.PromoteAbove == 0 && a.DemoteBelow == 0 && a.Hold == 0 && len(a.Regions) == 0
}

var autoFields = []string{"promote_above", "demote_below", "hold", "regions"}

// auto parses a mode auto rule's auto block.
func (p *parser) auto(src *ruleSrc, v *yaml.Node, seen map[string]bool) bool {
	field := src.field + ".auto"
	a := &src.rule.Auto
	ok := p.fields(v, field, "auto", autoFields, func(name string, k, v *yaml.Node) {
		rel := "auto." + name
		src.pos[rel] = v
		seen[rel] = true
		var ok bool
		switch name {
		case "promote_above":
			a.PromoteAbove, ok = p.rate(v, field+"."+name)
		case "demote_below":
			a.DemoteBelow, ok = p.rate(v, field+"."+name)
		case "hold":
			a.Hold, ok = p.duration(v, field+"."+name)
		case "regions":
			src.pos[rel] = k
			ok = p.autoRegions(src, v)
		}
		if !ok {
			src.bad[rel] = true
		}
	})
	defaultAuto(a, seen)
	src.fillAutoRegions()
	return ok
}

// autoRegions parses auto.regions: {ID: {promote_above, demote_below}}; a
// region's demote_below defaults to its promote_above/4, its
// promote_above to the rule's.
func (p *parser) autoRegions(src *ruleSrc, v *yaml.Node) bool {
	a := &src.rule.Auto
	a.Regions = make(map[region.ID]AutoThresholds, len(v.Content)/2)
	type given struct {
		id              region.ID
		promote, demote bool
	}
	var gs []given
	ok := p.regionMap(src, v, "auto.regions", "{promote_above, demote_below}", func(id region.ID, rel string, vn *yaml.Node) {
		var t AutoThresholds
		g := given{id: id}
		p.fields(vn, src.field+"."+rel, "a region", []string{"promote_above", "demote_below"}, func(name string, _, fv *yaml.Node) {
			src.pos[rel+"."+name] = fv
			var fok bool
			switch name {
			case "promote_above":
				t.PromoteAbove, fok = p.rate(fv, src.field+"."+rel+"."+name)
				g.promote = true
			case "demote_below":
				t.DemoteBelow, fok = p.rate(fv, src.field+"."+rel+"."+name)
				g.demote = true
			}
			if !fok {
				src.bad[rel+"."+name] = true
			}
		})
		a.Regions[id] = t
		gs = append(gs, g)
	})
	// Defaults are filled once the rule-wide promote_above is known (it may
	// come after regions in the block): see fillAutoRegions.
	src.autoPending = func() {
		for _, g := range gs {
			t := a.Regions[g.id]
			if !g.promote {
				t.PromoteAbove = a.PromoteAbove
			}
			if !g.demote {
				t.DemoteBelow = t.PromoteAbove / 4
			}
			a.Regions[g.id] = t
		}
	}
	return ok
}

// fillAutoRegions applies the region defaults autoRegions left pending.
func (src *ruleSrc) fillAutoRegions() {
	if src.autoPending != nil {
		src.autoPending()
		src.autoPending = nil
	}
}

// String describes the auto block as a log line would.
func (a Auto) String() string {
	return fmt.Sprintf("promote_above %s/s, demote_below %s/s, hold %v", fmtFloat(a.PromoteAbove), fmtFloat(a.DemoteBelow), a.Hold)
}

// PromotedSubject names the quota subject of one promotion of subject of a
// mode auto rule: "subject@epoch". Epochs are digits, so the last '@'
// splits it back (SplitPromoted) whatever the subject holds.
func PromotedSubject(subject string, epoch int64) string {
	return subject + "@" + strconv.FormatInt(epoch, 10)
}

// SplitPromoted reverses PromotedSubject; ok is false for a name that is
// not one (no '@', an epoch that is not a positive decimal, an empty
// subject).
func SplitPromoted(s string) (subject string, epoch int64, ok bool) {
	i := strings.LastIndexByte(s, '@')
	if i <= 0 || i == len(s)-1 {
		return "", 0, false
	}
	for _, c := range s[i+1:] {
		if c < '0' || c > '9' {
			return "", 0, false
		}
	}
	n, err := strconv.ParseInt(s[i+1:], 10, 64)
	if err != nil || n <= 0 || s[i+1] == '0' {
		return "", 0, false
	}
	return s[:i], n, true
}
