package rules

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/region"
)

// Limits on a rules file and on request descriptors. They bound memory and
// Redis key length, and keep a mistaken file (a generated one gone wrong)
// from becoming an outage of its own.
const (
	MaxRules       = 1000
	MaxMatchKeys   = 16
	MaxDescriptors = 64
	// MaxKeyLen bounds descriptor keys and values, in rules and in requests.
	MaxKeyLen = 256
	// MaxNameLen bounds a rule name; it is part of every Redis key of the rule.
	MaxNameLen = 63
	// MaxValue bounds burst, rate and slices. It is the bucket's own bound, so
	// a rule that parses is a rule every store accepts.
	MaxValue = bucket.MaxValue
	// MaxFileSize bounds the file read: 1000 rules of 16 maximal keys fit.
	MaxFileSize = 16 << 20
	// DefaultLeasePeriod is the lease length D of a leased rule that sets none.
	DefaultLeasePeriod = 10 * time.Second
	// Wildcard as a match value matches any value and gives every distinct
	// value its own bucket.
	Wildcard = "*"
	// MaxSubjectsLimit bounds lease.max_subjects (the coordinator's own
	// bound on it is the same).
	MaxSubjectsLimit = 1_000_000_000
	// DefaultSubject names, in a leased rule with lease.default_share, the
	// quota that holds the default part of every subject's budget. A
	// subject of a rule with "*" keys always holds '=' (it is "k=v,..."),
	// so no subject is ever this one.
	DefaultSubject = "*"
)

// Mode says where a rule's buckets live.
type Mode int

const (
	// ModeRedis keeps each bucket in the region's Redis primary. It is the
	// zero value because it is the default in the file.
	ModeRedis Mode = iota
	// ModeLeased decides locally from a budget slice leased from the
	// coordinator (hot keys, global quotas).
	ModeLeased
	// ModeAuto decides each subject in Redis until it is hot, then on
	// leases until it cools (auto.go, docs/leases.md Hot keys).
	ModeAuto
)

var modeNames = []string{ModeRedis: "redis", ModeLeased: "leased", ModeAuto: "auto"}

// Leases reports whether subjects of a rule in this mode may be decided on
// coordinator leases (its lease block applies).
func (m Mode) Leases() bool { return m == ModeLeased || m == ModeAuto }

// String returns the name used in the file.
func (m Mode) String() string {
	if m >= 0 && int(m) < len(modeNames) {
		return modeNames[m]
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// Policy is what a rule does when its store or coordinator cannot answer in
// time.
type Policy int

const (
	// FailClosed rejects (HTTP 503). It is the zero value on purpose: a Rule
	// built in code that forgets to choose fails safe, never open.
	FailClosed Policy = iota
	// FailOpen admits; the overshoot is unbounded while the failure lasts.
	FailOpen
	// Emergency admits from a small per-agent bucket for a bounded time,
	// then fails closed.
	Emergency
)

var policyNames = []string{FailClosed: "fail_closed", FailOpen: "fail_open", Emergency: "emergency"}

// String returns the name used in the file.
func (p Policy) String() string {
	if p >= 0 && int(p) < len(policyNames) {
		return policyNames[p]
	}
	return "Policy(" + strconv.Itoa(int(p)) + ")"
}

// EmergencyLimit is the per-agent bucket (b_e, r_e) used for at most
// MaxDuration (T_e) while the store is unreachable. The worst-case overshoot
// with N agents cut off for P is N x (Burst + Rate x min(P, MaxDuration)).
// (It is not named Emergency: that is the Policy constant.)
type EmergencyLimit struct {
	Burst, Rate float64
	MaxDuration time.Duration
}

// Lease tunes a leased rule's slices. MaxSlice 0 means no cap.
// MaxSubjects bounds the rule's quotas (one per subject) the coordinator
// holds at once; 0 means no bound.
//
// DefaultShare (f, in [0, 1]) splits every subject's budget in two: the
// part f is leased once per rule (the quota of DefaultSubject) and every
// agent spends its slice of it on each subject separately, with no request
// to the coordinator; the part 1-f is leased per subject as without it.
// A subject's admissions stay within B + r*T: at most f of it through the
// default part, 1-f through its own quota. 0 (the default) leases every
// subject on its own.
type Lease struct {
	Period             time.Duration
	MinSlice, MaxSlice float64
	MaxSubjects        int
	DefaultShare       float64
}

// Split is the part of a leased rule's shape (burst, rate and slices) that
// the quota of subject has: f for DefaultSubject, 1-f for every other
// subject, with f the rule's lease.default_share (so the whole when it is
// 0).
func (l Lease) Split(subject string) float64 {
	if l.DefaultShare <= 0 {
		if subject == DefaultSubject {
			return 0
		}
		return 1
	}
	if subject == DefaultSubject {
		return l.DefaultShare
	}
	return 1 - l.DefaultShare
}

// Wild reports whether the rule has "*" keys: one subject per distinct
// value, rather than one for every matching request.
func (r *Rule) Wild() bool {
	for _, v := range r.Match {
		if v == Wildcard {
			return true
		}
	}
	return false
}

// Rule is one named limit. A Rule obtained from a Set is shared and must not
// be modified.
type Rule struct {
	Name string
	// Match is the match block as written: key to exact value or Wildcard.
	Match       map[string]string
	Burst, Rate float64
	Mode        Mode
	OnFailure   Policy
	// Emergency is set iff OnFailure is Emergency.
	Emergency EmergencyLimit
	Shadow    bool
	// Lease is set iff Mode is ModeLeased or ModeAuto (Period defaults to
	// DefaultLeasePeriod).
	Lease Lease
	// Auto is set iff Mode is ModeAuto (defaults: DefaultPromoteAbove,
	// a quarter of it, DefaultHold).
	Auto Auto
	// Scope is how far the rule's number reaches (region.ScopeRegion by
	// default). Regions is set iff Scope is region.ScopeGlobal: each
	// region's weight, and with mode leased its safe share.
	Scope   region.Scope
	Regions map[region.ID]region.Weight
	// AllowOvershoot accepts safe shares that sum above the rate: cut off
	// from the global group, the regions may then admit more than the rule
	// (by region.Overshoot). Only with scope global, mode leased.
	AllowOvershoot bool
	// Line is where the rule starts in its file.
	Line int

	// The compiled matcher, built once by compile so Match does no sorting,
	// no parsing and no allocation beyond the subject string.
	keys    []string // match keys, sorted: the subject's key order
	want    []string // per key: the exact value wanted, unused when wild
	wild    []bool   // per key: "*"
	prefix  []string // per wildcard key: escaped "k=", with a leading "," after the first
	subjLen int      // sum of prefix lengths
	keyHead string   // bucket.KeyHead(Name): what a subject's bucket key starts with
	key0    string   // bucket.Key(Name, ""): the key of a rule without a wildcard key
	// shares is each region's part of a scope: global, mode: redis rule.
	shares map[region.ID]bucket.Limit
}

// Limit is the bucket the rule has in region id: the whole rule, except
// for scope: global, mode: redis, where it is the region's weighted share.
// ok is false when the rule is global and id is not one of its regions.
func (r *Rule) Limit(id region.ID) (l bucket.Limit, ok bool) {
	if r.Scope != region.ScopeGlobal || r.Mode != ModeRedis {
		return bucket.Limit{Burst: r.Burst, Rate: r.Rate}, true
	}
	l, ok = r.shares[id]
	return l, ok
}

// fieldProblem is a validation failure of one field, relative to its rule
// ("burst", "emergency.rate", "match.tenant"). The parser turns it into a
// Problem at the field's position.
type fieldProblem struct{ field, msg string }

// validate checks every value of a Rule. It is the single definition of a
// valid rule: the parser adds positions and type checks on top, and the
// fuzz target holds every parsed rule to it.
func (r *Rule) validate() []fieldProblem {
	var ps []fieldProblem
	add := func(field, format string, args ...any) {
		ps = append(ps, fieldProblem{field, fmt.Sprintf(format, args...)})
	}
	if msg := checkName(r.Name); msg != "" {
		add("name", "%s", msg)
	}
	switch n := len(r.Match); {
	case n == 0:
		add("match", "must have at least one key (use %q as the value to match any value)", Wildcard)
	case n > MaxMatchKeys:
		add("match", "has %d keys, at most %d", n, MaxMatchKeys)
	}
	for _, k := range slices.Sorted(maps.Keys(r.Match)) {
		v := r.Match[k]
		f := matchField(k)
		switch {
		case k == "":
			add(f, "key must not be empty")
		case len(k) > MaxKeyLen:
			add(f, "key is %d bytes, at most %d", len(k), MaxKeyLen)
		case !utf8.ValidString(k):
			add(f, "key is not valid UTF-8")
		}
		switch {
		case v == "":
			add(f, "value must not be empty; use %q to match any value", Wildcard)
		case len(v) > MaxKeyLen:
			add(f, "value is %d bytes, at most %d", len(v), MaxKeyLen)
		case !utf8.ValidString(v):
			add(f, "value is not valid UTF-8")
		}
	}
	if msg := checkRange(r.Burst, false); msg != "" {
		add("burst", "%s", msg)
	}
	if msg := checkRange(r.Rate, true); msg != "" {
		add("rate", "%s", msg)
	}
	if r.Mode != ModeRedis && r.Mode != ModeLeased && r.Mode != ModeAuto {
		add("mode", "%v is not one of %s", r.Mode, joinNames(modeNames))
	}
	switch r.OnFailure {
	case Emergency:
		if msg := checkRange(r.Emergency.Burst, false); msg != "" {
			add("emergency.burst", "%s", msg)
		}
		if msg := checkRange(r.Emergency.Rate, true); msg != "" {
			add("emergency.rate", "%s", msg)
		}
		if r.Emergency.MaxDuration <= 0 {
			add("emergency.max_duration", "must be > 0, got %v", r.Emergency.MaxDuration)
		}
	case FailClosed, FailOpen:
		if r.Emergency != (EmergencyLimit{}) {
			add("emergency", "is set, but on_failure is %v: it would never be used; remove it or set on_failure: emergency", r.OnFailure)
		}
	default:
		add("on_failure", "%v is not one of %s", r.OnFailure, joinNames(policyNames))
	}
	r.validateAuto(add)
	if r.Mode.Leases() {
		l := r.Lease
		if l.Period <= 0 {
			add("lease.period", "must be > 0, got %v", l.Period)
		}
		// min_slice and max_slice bound each holder's rate share, in
		// tokens/s (lease.QuotaConfig), so they are held to rate, not
		// burst: a min_slice above the rate could never be granted, a
		// max_slice above it would never bind (most likely a value
		// written as tokens). A rule with rate 0 sizes caps by slice x
		// period instead, so there the bound is burst/period.
		// default_share scales rate and slices alike, so a rule valid
		// here is valid for both of its parts.
		sliceTo, unit := r.Rate, "rate "+fmtFloat(r.Rate)+" tokens/s"
		if r.Rate == 0 && l.Period > 0 {
			sliceTo = r.Burst / l.Period.Seconds()
			unit = fmt.Sprintf("burst %s over the lease period %v (rate is 0), %s tokens/s", fmtFloat(r.Burst), l.Period, fmtFloat(sliceTo))
		}
		bounded := checkRange(r.Burst, false) == "" && checkRange(r.Rate, true) == "" && (r.Rate > 0 || l.Period > 0)
		if msg := checkRange(l.MinSlice, true); msg != "" {
			add("lease.min_slice", "%s", msg)
		} else if bounded && l.MinSlice > sliceTo {
			add("lease.min_slice", "%s tokens/s exceeds %s: it is each holder's least rate share, so no slice could ever be granted", fmtFloat(l.MinSlice), unit)
		}
		if msg := checkRange(l.MaxSlice, true); msg != "" {
			add("lease.max_slice", "%s", msg)
		} else if l.MaxSlice != 0 && l.MaxSlice < l.MinSlice {
			add("lease.max_slice", "%s is below min_slice %s (0 means no cap)", fmtFloat(l.MaxSlice), fmtFloat(l.MinSlice))
		} else if bounded && l.MaxSlice > sliceTo {
			add("lease.max_slice", "%s tokens/s exceeds %s: it is each holder's largest rate share, so it would never bind; lower it, or 0 for no cap", fmtFloat(l.MaxSlice), unit)
		}
		if l.MaxSubjects < 0 || l.MaxSubjects > MaxSubjectsLimit {
			add("lease.max_subjects", "must be in [0, %d] (0 means no bound), got %d", MaxSubjectsLimit, l.MaxSubjects)
		}
		switch {
		case !(l.DefaultShare >= 0 && l.DefaultShare <= 1):
			add("lease.default_share", "must be a fraction in [0, 1] (0 means off), got %s", fmtFloat(l.DefaultShare))
		case l.DefaultShare > 0 && !r.Wild():
			add("lease.default_share", "is set, but match has no %q key: the rule has one subject, so there is nothing to share by default; remove it", Wildcard)
		}
	} else if r.Lease != (Lease{}) {
		add("lease", "is set, but mode is %v: it would never be used; remove it or set mode: leased (or auto)", r.Mode)
	}
	ps = append(ps, r.validateScope()...)
	return ps
}

// validateScope checks scope, regions and allow_overshoot.
func (r *Rule) validateScope() []fieldProblem {
	var ps []fieldProblem
	add := func(field, format string, args ...any) {
		ps = append(ps, fieldProblem{field, fmt.Sprintf(format, args...)})
	}
	switch r.Scope {
	case region.ScopeRegion:
		if len(r.Regions) > 0 {
			add("regions", "is set, but scope is region: it would never be used; remove it or set scope: global")
		}
		if r.AllowOvershoot {
			add("allow_overshoot", "is set, but scope is region: it would never be used")
		}
		return ps
	case region.ScopeGlobal:
	default:
		add("scope", "%v is not one of %s", r.Scope, joinNames(region.ScopeNames))
		return ps
	}
	switch n := len(r.Regions); {
	case n == 0:
		add("regions", "required when scope is global: each region's weight (and safe_share with mode: leased)")
	case n > region.MaxRegions:
		add("regions", "has %d regions, at most %d", n, region.MaxRegions)
	}
	var safe float64
	for _, id := range slices.Sorted(maps.Keys(r.Regions)) {
		w := r.Regions[id]
		f := "regions." + string(id)
		if msg := id.Check(); msg != "" {
			f = "regions[" + strconv.Quote(string(id)) + "]"
			add(f, "region name %s", msg)
		}
		if !(w.Weight >= MinWeight && w.Weight <= MaxWeight) {
			add(f+".weight", "must be in [%s, %s], got %s", fmtFloat(MinWeight), fmtFloat(MaxWeight), fmtFloat(w.Weight))
		}
		switch {
		case w.SafeShare != 0 && r.Mode != ModeLeased:
			add(f+".safe_share", "is set, but mode is %v: only leased rules fall back to a safe share", r.Mode)
		case checkRange(w.SafeShare, true) != "":
			add(f+".safe_share", "%s", checkRange(w.SafeShare, true))
		case w.SafeShare > r.Rate && checkRange(r.Rate, true) == "":
			add(f+".safe_share", "%s exceeds rate %s", fmtFloat(w.SafeShare), fmtFloat(r.Rate))
		default:
			safe += w.SafeShare
		}
	}
	switch {
	case r.Mode != ModeLeased && r.AllowOvershoot:
		add("allow_overshoot", "is set, but mode is %v: only leased rules have safe shares", r.Mode)
	case r.Mode == ModeLeased && safe > r.Rate && !r.AllowOvershoot && checkRange(r.Rate, true) == "":
		add("regions", "safe shares sum to %s, above rate %s: regions cut off from the global group could admit %s tokens/s too many; lower them or set allow_overshoot: true",
			fmtFloat(safe), fmtFloat(r.Rate), fmtFloat(safe-r.Rate))
	}
	return ps
}

// Region weights are fairness weights between regions (lease.MinWeight,
// lease.MaxWeight).
const (
	MinWeight = 1e-6
	MaxWeight = 1e6
)

// CheckRegion reports the rules that cannot be enforced in region id: the
// global ones that do not name it. An agent refuses such a file rather than
// guess a share.
func (s *Set) CheckRegion(id region.ID) error {
	var missing []string
	for _, r := range s.rules {
		if r.Scope == region.ScopeGlobal {
			if _, ok := r.Regions[id]; !ok {
				missing = append(missing, r.Name)
			}
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("rules: %w: rules %v are scope: global but have no share for region %q (add it under regions)", ErrInvalidFile, missing, id)
	}
	return nil
}

// checkName enforces [a-z0-9][a-z0-9_.-]{0,62}. The alphabet excludes '{',
// '}' and '|', so the Redis key ration:{rule|subject} has one hash tag and
// splits unambiguously at the first '|'.
func checkName(name string) string {
	if name == "" {
		return "must not be empty"
	}
	if len(name) > MaxNameLen {
		return fmt.Sprintf("is %d bytes, at most %d", len(name), MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && (c == '_' || c == '.' || c == '-')
		if !ok {
			return fmt.Sprintf("%q must match [a-z0-9][a-z0-9_.-]{0,62}", name)
		}
	}
	return ""
}

// checkRange bounds a token count or rate: (0, MaxValue], or [0, MaxValue]
// when zero is allowed.
func checkRange(v float64, zeroOK bool) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0) || v > MaxValue || v < 0 || v == 0 && !zeroOK:
		if zeroOK {
			return fmt.Sprintf("must be in [0, %s], got %s", fmtFloat(MaxValue), fmtFloat(v))
		}
		return fmt.Sprintf("must be in (0, %s], got %s", fmtFloat(MaxValue), fmtFloat(v))
	}
	return ""
}

func fmtFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

func joinNames(names []string) string {
	s := ""
	for i, n := range names {
		if i > 0 {
			s += ", "
		}
		s += n
	}
	return s
}

// matchField names one match key in an error. Keys that are not plain
// identifiers are quoted so the field stays readable and unambiguous.
func matchField(k string) string {
	plain := k != "" && len(k) <= 64
	for i := 0; plain && i < len(k); i++ {
		c := k[i]
		plain = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
	}
	if plain {
		return "match." + k
	}
	if len(k) > 64 {
		k = k[:64] + "..."
	}
	return "match[" + strconv.Quote(k) + "]"
}
