package lease

import (
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// Limits on command fields. Beyond them float64 arithmetic on microsecond
// timestamps loses whole tokens or int64 time overflows, so larger values are
// rejected rather than silently mis-counted.
const (
	// MaxValue bounds burst, rate, demand, slices and token amounts.
	MaxValue = 1e12
	// MinRate is the smallest non-zero quota rate (one token in 11.6 days):
	// caps are sized by B/r, which must stay finite.
	MinRate = 1e-6
	// MinWeight and MaxWeight bound a holder's fairness weight: a ratio of
	// 1e12 between weights still leaves float64 room for the water level.
	MinWeight = 1e-6
	MaxWeight = 1e6
	// MaxTime bounds Now (microseconds): about 36,000 years past the epoch,
	// far enough from MaxInt64 that Now + period + margin cannot overflow.
	MaxTime = int64(1) << 60
	// MaxPeriod bounds LeasePeriod and SafetyMargin: one day in microseconds.
	MaxPeriod = int64(24 * 60 * 60 * 1e6)
	// MaxNameLen bounds quota and holder names, in bytes.
	MaxNameLen = 256
	// MaxItems bounds the items of one Renew.
	MaxItems = 10000
	// MaxSubjectsLimit bounds QuotaConfig.MaxSubjects.
	MaxSubjectsLimit = 1_000_000_000
)

// Kind is a command's type, the first byte of its encoding. Values are part
// of the replicated log format: never renumber or reuse one.
type Kind uint8

// The command kinds.
const (
	KindConfigureQuota Kind = 1
	KindGrant          Kind = 2
	KindRenew          Kind = 3
	KindRelease        Kind = 4
	KindTick           Kind = 5
	KindLeaderElected  Kind = 6
	KindFund           Kind = 7
	KindTune           Kind = 8
)

func (k Kind) String() string {
	switch k {
	case KindConfigureQuota:
		return "configure"
	case KindGrant:
		return "grant"
	case KindRenew:
		return "renew"
	case KindRelease:
		return "release"
	case KindTick:
		return "tick"
	case KindLeaderElected:
		return "leader-elected"
	case KindFund:
		return "fund"
	case KindTune:
		return "tune"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Command is one entry of the replicated log. The set is closed: only the
// types of this package implement it (ConfigureQuota, Grant, Renew, Release,
// Tick, LeaderElected, Fund, as values or pointers).
//
// Every command carries Now, the leader's clock in microseconds when it
// stamped the entry. Holders leave it zero; the leader fills it in.
type Command interface {
	Kind() Kind
	validate() error
}

// QuotaConfig is the shape of one leased quota.
type QuotaConfig struct {
	// Burst is B, the quota's capacity in tokens: (0, MaxValue].
	Burst float64 `json:"burst"`
	// Rate is r, its refill in tokens per second: 0 (a fixed allowance that
	// never refills) or [MinRate, MaxValue].
	Rate float64 `json:"rate"`
	// LeasePeriod is D, the length of a lease term in microseconds:
	// (0, MaxPeriod].
	LeasePeriod int64 `json:"lease_period"`
	// MinSlice and MaxSlice bound each holder's rate share in tokens per
	// second; its cap is bounded by the same slices scaled by B/r (by the
	// lease period in seconds when r is 0). MaxSlice 0 means no maximum;
	// otherwise MinSlice <= MaxSlice <= MaxValue.
	MinSlice float64 `json:"min_slice"`
	MaxSlice float64 `json:"max_slice"`
	// SafetyMargin is how long after a lease's expiry it is reclaimed, in
	// microseconds: it covers clock-rate drift and the largest clock offset
	// between coordinator nodes. [0, MaxPeriod].
	SafetyMargin int64 `json:"safety_margin"`
	// Funded marks a quota whose capacity comes (mostly) from an upstream
	// lease: Burst and Rate are only its own part (a region's safe share,
	// which may be 0), and Fund adds the upstream lease's cap and rate for
	// as long as that lease is valid. See Fund.
	Funded bool `json:"funded,omitempty"`
	// Rule names the group of quotas (the coordinator's rule) the quota
	// belongs to, for MaxSubjects; "" belongs to none.
	Rule string `json:"rule,omitempty"`
	// MaxSubjects, when > 0, bounds the quotas of Rule that may exist at
	// once: a command that would create one more is refused with
	// ErrTooManySubjects. [0, MaxSubjectsLimit]; > 0 needs Rule. The
	// quotas that exist count, idle ones included until Tick removes them;
	// lowering it removes nothing.
	MaxSubjects int `json:"max_subjects,omitempty"`
	// StartEmpty makes a new quota's pool start empty (P = 0) instead of
	// full: the quota of one promotion of a hot key (a rule in mode auto),
	// whose budget the key's store bucket may have spent up to the moment
	// of promotion. Its leases then hand out only what refills after the
	// quota exists, which is what keeps the rule's bound across the
	// hand-over. Not with Funded.
	StartEmpty bool `json:"start_empty,omitempty"`
}

// ConfigureQuota creates a quota, or updates it in place. A new quota's pool
// starts full (P = B). Lowering B or r below what is leased never revokes
// anything: the pool gives up tokens first, and leases shrink at their next
// renewal; until they have, the quota is held to the larger of the old
// reservations and the new limits (see QuotaInfo.CeilBurst). Creating a
// quota past its rule's MaxSubjects is refused (ErrTooManySubjects).
//
// A quota may be removed by Tick once idle (doc.go, "Bounded state"), so a
// quota configured earlier may not exist any more: Grant carries its own
// Config and recreates it. ConfigureQuota is for changing the shape of a
// quota that exists.
type ConfigureQuota struct {
	Now          int64   `json:"now"`
	Quota        string  `json:"quota"`
	Burst        float64 `json:"burst"`
	Rate         float64 `json:"rate"`
	LeasePeriod  int64   `json:"lease_period"`
	MinSlice     float64 `json:"min_slice"`
	MaxSlice     float64 `json:"max_slice"`
	SafetyMargin int64   `json:"safety_margin"`
	Funded       bool    `json:"funded,omitempty"`
	Rule         string  `json:"rule,omitempty"`
	MaxSubjects  int     `json:"max_subjects,omitempty"`
	StartEmpty   bool    `json:"start_empty,omitempty"`
}

// Config returns the quota shape c sets.
func (c ConfigureQuota) Config() QuotaConfig {
	return QuotaConfig{
		Burst: c.Burst, Rate: c.Rate, LeasePeriod: c.LeasePeriod,
		MinSlice: c.MinSlice, MaxSlice: c.MaxSlice, SafetyMargin: c.SafetyMargin,
		Funded: c.Funded, Rule: c.Rule, MaxSubjects: c.MaxSubjects, StartEmpty: c.StartEmpty,
	}
}

// Funding is what an upstream lease adds to a funded quota: its cap and
// rate, until NotAfter (the state's clock, microseconds).
type Funding struct {
	Burst    float64 `json:"burst"`
	Rate     float64 `json:"rate"`
	NotAfter int64   `json:"not_after"`
}

// Active reports whether f adds anything at now.
func (f Funding) Active(now int64) bool { return (f.Burst > 0 || f.Rate > 0) && now < f.NotAfter }

// Fund sets what an upstream lease adds to a funded quota, the hierarchy's
// link between levels (docs/architecture.md, Regions). A regional
// coordinator holds a lease L = (b, r, validity) from the global group and
// spends it by subleasing: the quota's capacity becomes
// (Burst + b, Rate + r) of its own ConfigureQuota plus this Fund, Deposit
// (the tokens L's answer moved into the holder's bucket) goes into the pool,
// within its room, and no lease term granted while the funding is active
// ends after NotAfter, the end of L's validity on the clock that stamps this
// state's commands: a sublease never outlives its parent (except a
// hand-over answer, sized out of the own part alone, in the last quarter
// period before NotAfter: handover.go). At NotAfter the
// funding drops by itself (deterministically, at the first command at or
// after it), and the quota is back to its own part; a LeaderElected drops it
// too, since NotAfter was measured on the old leader's clock. Lowering works
// as in ConfigureQuota: nothing is revoked, the quota is held to a ceiling
// until the larger subleases have shrunk or ended. Burst and Rate 0 drop the
// funding.
//
// The pool is the holder's bucket of L: it refills at most at
// (Rate + r) - sum(r_i), up to (Burst + b) - sum(b_i), exactly the refill L
// allows its holder plus the quota's own part, and it holds L's tokens only
// while L is valid. So the sublessees together never spend more than L
// allows plus the quota's own part, and conservation at the upper level
// carries down.
//
// Seq is the sequence number of the upstream request whose answer this
// funds (0 in logs written before it existed). The state keeps the largest
// one applied (UpstreamSeq) and refuses an older one with ErrStale: an
// upstream answer is deposited once, even if a later leader of this group
// were answered it again (a recorded answer replayed to a reused number),
// and a new leader numbers its requests past every answer already funded.
type Fund struct {
	Now      int64   `json:"now"`
	Quota    string  `json:"quota"`
	Burst    float64 `json:"burst"`
	Rate     float64 `json:"rate"`
	Deposit  float64 `json:"deposit"`
	NotAfter int64   `json:"not_after"`
	Seq      uint64  `json:"seq,omitempty"`
}

// Grant asks for a lease on Quota for Holder. A holder has at most one
// lease per quota: a Grant for a quota the holder already leases renews
// that lease (same ID while it is live, a new ID once it has expired), with
// nothing returned and nothing confirmed.
//
// A Grant with Config creates the quota at that shape (full, as
// ConfigureQuota would) when it does not exist, so a grant never depends on
// an earlier ConfigureQuota still being there: Tick removes idle quotas.
// Config is ignored when the quota exists. A creation past the rule's
// MaxSubjects is answered ErrTooManySubjects, recorded like any answer.
type Grant struct {
	Now    int64  `json:"now"`
	Holder string `json:"holder"`
	// Seq is the holder's sequence number: > 0, increasing across all of
	// the holder's commands (and across its restarts; see doc.go).
	Seq   uint64 `json:"seq"`
	Quota string `json:"quota"`
	// Demand is the tokens per second the holder wants, counting requests
	// it rejected: [0, MaxValue].
	Demand float64 `json:"demand"`
	// Weight is the holder's fairness weight for this quota; 0 means 1.
	Weight float64 `json:"weight,omitempty"`
	// Bounds, when set, replace the quota's lease period and slice bounds
	// for this holder's lease (an operator's per-region tuning).
	Bounds *Bounds `json:"bounds,omitempty"`
	// Config, when set, is the quota's shape, to create it with if it does
	// not exist. It is new in command version 2.
	Config *QuotaConfig `json:"config,omitempty"`
}

// Bounds are one lease's own lease period (µs; 0: the quota's) and rate
// slice bounds (MaxSlice 0: no maximum), replacing the quota's.
type Bounds struct {
	Period   int64   `json:"period,omitempty"`
	MinSlice float64 `json:"min_slice"`
	MaxSlice float64 `json:"max_slice"`
}

func (b *Bounds) clone() *Bounds {
	if b == nil {
		return nil
	}
	c := *b
	return &c
}

func (b *Bounds) check(p *problems, prefix string) {
	if b == nil {
		return
	}
	if b.Period != 0 {
		p.period(prefix+"bounds.period", b.Period, false)
	}
	p.amount(prefix+"bounds.min_slice", b.MinSlice)
	p.amount(prefix+"bounds.max_slice", b.MaxSlice)
	if b.MaxSlice != 0 && b.MaxSlice < b.MinSlice {
		p.addf("%sbounds.max_slice %v < min_slice %v (0 means no maximum)", prefix, b.MaxSlice, b.MinSlice)
	}
}

// Tuning is an operator's run-time override of a rule's lease settings,
// for one region or (Region "") as the default for all. Zero fields (nil
// for the slices) are not overridden. The state only keeps the table,
// replicated and snapshotted; the coordinator applies it when it builds
// the commands for a quota (see the coordinator package).
type Tuning struct {
	Rule   string `json:"rule"`
	Region string `json:"region"`
	// LeasePeriod is D in µs: (0, MaxPeriod].
	LeasePeriod int64 `json:"lease_period,omitempty"`
	// RenewAt is a regional group's renew point for its upstream lease:
	// (0, 1).
	RenewAt float64 `json:"renew_at,omitempty"`
	// MinSlice and MaxSlice bound each lease's rate share (tokens/s).
	MinSlice *float64 `json:"min_slice,omitempty"`
	MaxSlice *float64 `json:"max_slice,omitempty"`
	// Weight is the region's fairness weight: [MinWeight, MaxWeight].
	Weight float64 `json:"weight,omitempty"`
	// SafeShare is the region's safe share of a scope: global rule, tokens
	// per second, [0, MaxValue] (regions only, never the default). In the
	// global group it is the operators' target; in a regional group it is
	// the value learned from the global group's answers (Tune.Safe
	// "learn"). It survives Tunes that leave it unset and Clear: only a
	// Tune that sets it changes it. See the coordinator's safe.go.
	SafeShare *float64 `json:"safe_share,omitempty"`
	// SafePrev, in the global group, is the safe share SafeShare replaces
	// while the change is pending: the global group counts max(SafePrev,
	// SafeShare) against what it leases and tells the region min(...),
	// until a Tune with Safe "settle" clears it. nil: no change pending.
	SafePrev *float64 `json:"safe_prev,omitempty"`
}

// Key names a tuning in the table.
func (t Tuning) Key() string { return t.Rule + "/" + t.Region }

// Empty reports whether t overrides nothing.
func (t Tuning) Empty() bool {
	return t.LeasePeriod == 0 && t.RenewAt == 0 && t.MinSlice == nil && t.MaxSlice == nil && t.Weight == 0 && t.SafeShare == nil
}

// Counted is the safe share the global group counts against what it
// leases: max(SafePrev, SafeShare) while a change is pending. ok is false
// when no safe share is tuned.
func (t Tuning) Counted() (float64, bool) {
	if t.SafeShare == nil {
		return 0, false
	}
	if t.SafePrev != nil {
		return max(*t.SafePrev, *t.SafeShare), true
	}
	return *t.SafeShare, true
}

// Allowed is the safe share the global group tells the region it may use:
// min(SafePrev, SafeShare) while a change is pending.
func (t Tuning) Allowed() (float64, bool) {
	if t.SafeShare == nil {
		return 0, false
	}
	if t.SafePrev != nil {
		return min(*t.SafePrev, *t.SafeShare), true
	}
	return *t.SafeShare, true
}

// Pending reports whether a safe-share change is pending.
func (t Tuning) Pending() bool { return t.SafeShare != nil && t.SafePrev != nil }

// Over returns t with every field it leaves unset taken from base.
func (t Tuning) Over(base Tuning) Tuning {
	if t.LeasePeriod == 0 {
		t.LeasePeriod = base.LeasePeriod
	}
	if t.RenewAt == 0 {
		t.RenewAt = base.RenewAt
	}
	if t.MinSlice == nil {
		t.MinSlice = base.MinSlice
	}
	if t.MaxSlice == nil {
		t.MaxSlice = base.MaxSlice
	}
	if t.Weight == 0 {
		t.Weight = base.Weight
	}
	return t
}

// Check reports every problem of the tuning at once, naming each field.
func (t Tuning) Check() error {
	var p problems
	t.check(&p)
	return p.err(fmt.Sprintf("tune %q region %q", t.Rule, t.Region))
}

func (t Tuning) check(p *problems) {
	p.name("rule", t.Rule)
	if len(t.Region) > MaxNameLen {
		p.addf("region is %d bytes, at most %d", len(t.Region), MaxNameLen)
	}
	if t.LeasePeriod != 0 {
		p.period("lease_period", t.LeasePeriod, false)
	}
	if t.RenewAt != 0 && !(t.RenewAt > 0 && t.RenewAt < 1) {
		p.addf("renew_at %v must be in (0, 1)", t.RenewAt)
	}
	if t.MinSlice != nil {
		p.amount("min_slice", *t.MinSlice)
	}
	if t.MaxSlice != nil {
		p.amount("max_slice", *t.MaxSlice)
	}
	if t.MinSlice != nil && t.MaxSlice != nil && *t.MaxSlice != 0 && *t.MaxSlice < *t.MinSlice {
		p.addf("max_slice %v < min_slice %v (0 means no maximum)", *t.MaxSlice, *t.MinSlice)
	}
	if t.Weight != 0 && !(t.Weight >= MinWeight && t.Weight <= MaxWeight) {
		p.addf("weight %v must be in [%g, %g]", t.Weight, float64(MinWeight), float64(MaxWeight))
	}
	if t.SafeShare != nil {
		p.amount("safe_share", *t.SafeShare)
		if t.Region == "" {
			p.addf("safe_share is per region: region must not be empty")
		}
	}
	if t.SafePrev != nil {
		p.amount("safe_prev", *t.SafePrev)
		if t.SafeShare == nil {
			p.addf("safe_prev without safe_share")
		}
	}
}

// Tune sets (or, with Clear, removes) the tuning of Tuning.Rule and
// Tuning.Region, replacing the whole record except its safe share: a Tune
// that leaves SafeShare nil (and Clear) keeps the record's SafeShare and
// SafePrev. With Safe "":
//
//   - SafeShare set: it becomes the target. The value it replaces is the
//     record's SafeShare, or Tuning.SafePrev (the rules file's value, given
//     by the coordinator) when the record has none; if that differs, it is
//     kept as SafePrev (pending). Refused while a change is pending.
//
// With Safe "settle" (the global group's leader): if the record's
// SafeShare equals Tuning.SafeShare, SafePrev is cleared (the change has
// taken effect); otherwise nothing happens. Nothing else changes.
//
// With Safe "learn" (a regional group's leader): the record's SafeShare
// becomes Tuning.SafeShare, SafePrev nil; nothing else changes.
type Tune struct {
	Now    int64  `json:"now"`
	Tuning Tuning `json:"tuning"`
	Clear  bool   `json:"clear,omitempty"`
	Safe   string `json:"safe,omitempty"`
}

// The values of Tune.Safe.
const (
	SafeSettle = "settle"
	SafeLearn  = "learn"
)

// RenewItem renews one lease within a Renew.
type RenewItem struct {
	LeaseID uint64 `json:"lease_id"`
	Quota   string `json:"quota"`
	// Unused is the number of tokens the holder gives back: it took them out
	// of its bucket when it SENT the renew and will never spend them, whatever
	// the answer (see doc.go, "Token semantics"). [0, MaxValue].
	Unused float64 `json:"unused"`
	// Demand is as in Grant.
	Demand float64 `json:"demand"`
	// Weight is as in Grant; 0 means 1.
	Weight float64 `json:"weight,omitempty"`
	// Bounds is as in Grant.
	Bounds *Bounds `json:"bounds,omitempty"`
	// ConfirmedCap and ConfirmedRate are the cap and rate the holder is
	// spending under now (those of the latest answer it adopted). When they
	// equal the lease's latest answer, a pending shrink is confirmed and the
	// old sizes stop being reserved.
	ConfirmedCap  float64 `json:"confirmed_cap"`
	ConfirmedRate float64 `json:"confirmed_rate"`
}

// Renew renews all of one holder's leases in one command. Each item is
// answered on its own; one bad lease does not fail the others.
type Renew struct {
	Now    int64       `json:"now"`
	Holder string      `json:"holder"`
	Seq    uint64      `json:"seq"`
	Items  []RenewItem `json:"items"`
}

// Release gives a lease back. The holder stops spending it when it SENDS the
// release, and Unused (its whole remaining balance) is credited to the pool
// within the caps described in doc.go; a release after the lease's expiry
// credits nothing.
type Release struct {
	Now     int64   `json:"now"`
	Holder  string  `json:"holder"`
	Seq     uint64  `json:"seq"`
	LeaseID uint64  `json:"lease_id"`
	Unused  float64 `json:"unused"`
}

// Tick advances time: it refills pools, ends shrink reservations whose old
// term is over and reclaims leases whose reclaim time has passed. The leader
// proposes one periodically.
type Tick struct {
	Now int64 `json:"now"`
}

// LeaderElected is the first entry a new leader commits, before it serves
// anything: every live lease's reclaim time (and every pending shrink
// reservation) is pushed to at least Now + its term + the safety margin,
// because the new leader does not trust the old leader's clock. For the same
// reason, the pools do not refill over the jump between the last entry and
// this one.
type LeaderElected struct {
	Now int64 `json:"now"`
}

// Kind implements Command.
func (ConfigureQuota) Kind() Kind { return KindConfigureQuota }

// Kind implements Command.
func (Grant) Kind() Kind { return KindGrant }

// Kind implements Command.
func (Fund) Kind() Kind { return KindFund }

// Kind implements Command.
func (Tune) Kind() Kind { return KindTune }

// Kind implements Command.
func (Renew) Kind() Kind { return KindRenew }

// Kind implements Command.
func (Release) Kind() Kind { return KindRelease }

// Kind implements Command.
func (Tick) Kind() Kind { return KindTick }

// Kind implements Command.
func (LeaderElected) Kind() Kind { return KindLeaderElected }

// problems collects every problem of a command, so one error names them all.
type problems []string

func (p *problems) addf(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

func (p problems) err(what string) error {
	if len(p) == 0 {
		return nil
	}
	return fmt.Errorf("lease: %s: %w: %s", what, ErrInvalid, strings.Join(p, "; "))
}

func (p *problems) time(field string, v int64) {
	if v < 0 || v > MaxTime {
		p.addf("%s %d must be in [0, %d]", field, v, MaxTime)
	}
}

func (p *problems) period(field string, v int64, zeroOK bool) {
	lo := int64(1)
	if zeroOK {
		lo = 0
	}
	if v < lo || v > MaxPeriod {
		p.addf("%s %d must be in [%d, %d] µs", field, v, lo, MaxPeriod)
	}
}

// amount checks a finite value in [0, MaxValue]; NaN fails every comparison
// and is caught by the negated form.
func (p *problems) amount(field string, v float64) {
	if !(v >= 0 && v <= MaxValue) {
		p.addf("%s %v must be in [0, %g]", field, v, float64(MaxValue))
	}
}

func (p *problems) weight(field string, v float64) {
	if v != 0 && !(v >= MinWeight && v <= MaxWeight) {
		p.addf("%s %v must be 0 (default 1) or in [%g, %g]", field, v, float64(MinWeight), float64(MaxWeight))
	}
}

func (p *problems) name(field, v string) {
	switch {
	case v == "":
		p.addf("%s is empty", field)
	case len(v) > MaxNameLen:
		p.addf("%s is %d bytes, at most %d", field, len(v), MaxNameLen)
	case !utf8.ValidString(v):
		p.addf("%s %q is not valid UTF-8", field, v)
	}
}

func (p *problems) seq(v uint64) {
	if v == 0 {
		p.addf("seq must be > 0")
	}
}

func (c QuotaConfig) check(p *problems) {
	switch {
	case c.Funded && !(c.Burst >= 0 && c.Burst <= MaxValue):
		p.addf("burst %v must be in [0, %g] (funded)", c.Burst, float64(MaxValue))
	case !c.Funded && !(c.Burst > 0 && c.Burst <= MaxValue):
		p.addf("burst %v must be in (0, %g]", c.Burst, float64(MaxValue))
	}
	if c.Rate != 0 && !(c.Rate >= MinRate && c.Rate <= MaxValue) {
		p.addf("rate %v must be 0 or in [%g, %g]", c.Rate, float64(MinRate), float64(MaxValue))
	}
	p.period("lease_period", c.LeasePeriod, false)
	p.period("safety_margin", c.SafetyMargin, true)
	p.amount("min_slice", c.MinSlice)
	p.amount("max_slice", c.MaxSlice)
	if c.MaxSlice != 0 && c.MaxSlice < c.MinSlice {
		p.addf("max_slice %v < min_slice %v (0 means no maximum)", c.MaxSlice, c.MinSlice)
	}
	if c.Rule != "" {
		p.name("rule", c.Rule)
	}
	switch {
	case c.MaxSubjects < 0 || c.MaxSubjects > MaxSubjectsLimit:
		p.addf("max_subjects %d must be in [0, %d]", c.MaxSubjects, MaxSubjectsLimit)
	case c.MaxSubjects > 0 && c.Rule == "":
		p.addf("max_subjects %d needs a rule to count the quotas of", c.MaxSubjects)
	}
	if c.StartEmpty && c.Funded {
		p.addf("start_empty and funded: a funded quota's pool is its upstream lease's deposit")
	}
}

// Validate reports every problem of the configuration at once.
func (c QuotaConfig) Validate() error {
	var p problems
	c.check(&p)
	return p.err("quota config")
}

func (c ConfigureQuota) validate() error {
	var p problems
	p.time("now", c.Now)
	p.name("quota", c.Quota)
	c.Config().check(&p)
	return p.err(fmt.Sprintf("configure %q", c.Quota))
}

func (c Fund) validate() error {
	var p problems
	p.time("now", c.Now)
	p.name("quota", c.Quota)
	p.amount("burst", c.Burst)
	p.amount("rate", c.Rate)
	if c.Rate != 0 && c.Rate < MinRate {
		p.addf("rate %v must be 0 or at least %g", c.Rate, float64(MinRate))
	}
	p.amount("deposit", c.Deposit)
	p.time("not_after", c.NotAfter)
	return p.err(fmt.Sprintf("fund %q", c.Quota))
}

func (c Grant) validate() error {
	var p problems
	p.time("now", c.Now)
	p.name("holder", c.Holder)
	p.seq(c.Seq)
	p.name("quota", c.Quota)
	p.amount("demand", c.Demand)
	p.weight("weight", c.Weight)
	c.Bounds.check(&p, "")
	if c.Config != nil {
		var cp problems
		c.Config.check(&cp)
		for _, msg := range cp {
			p.addf("config.%s", msg)
		}
	}
	return p.err(fmt.Sprintf("grant %q to %q", c.Quota, c.Holder))
}

func (c Tune) validate() error {
	var p problems
	p.time("now", c.Now)
	c.Tuning.check(&p)
	switch c.Safe {
	case "":
	case SafeSettle, SafeLearn:
		if c.Tuning.SafeShare == nil || c.Clear {
			p.addf("safe %q needs safe_share and no clear", c.Safe)
		}
	default:
		p.addf("safe %q must be empty, %q or %q", c.Safe, SafeSettle, SafeLearn)
	}
	if !c.Clear && c.Tuning.Empty() {
		p.addf("nothing to set (use clear to remove a tuning)")
	}
	return p.err(fmt.Sprintf("tune %q region %q", c.Tuning.Rule, c.Tuning.Region))
}

func (c Renew) validate() error {
	var p problems
	p.time("now", c.Now)
	p.name("holder", c.Holder)
	p.seq(c.Seq)
	switch {
	case len(c.Items) == 0:
		p.addf("no items")
	case len(c.Items) > MaxItems:
		p.addf("%d items, at most %d", len(c.Items), MaxItems)
	}
	var seen map[uint64]bool
	if len(c.Items) > 1 {
		seen = make(map[uint64]bool, len(c.Items))
	}
	for i, it := range c.Items {
		if it.LeaseID != 0 && !seen[it.LeaseID] {
			// The usual case, a good item, without naming its fields: the
			// same checks into a scratch list, named only if they fail.
			var scratch problems
			it.check(&scratch, func(string) string { return "" })
			if len(scratch) == 0 {
				if seen != nil {
					seen[it.LeaseID] = true
				}
				continue
			}
		}
		f := func(name string) string { return fmt.Sprintf("items[%d].%s", i, name) }
		if it.LeaseID == 0 {
			p.addf("%s must be > 0", f("lease_id"))
		} else if seen[it.LeaseID] {
			p.addf("%s %d appears twice", f("lease_id"), it.LeaseID)
		}
		if seen != nil {
			seen[it.LeaseID] = true
		}
		it.check(&p, f)
	}
	return p.err(fmt.Sprintf("renew by %q", c.Holder))
}

// check adds the problems of one item's values (not of its lease id), each
// field named by f.
func (it RenewItem) check(p *problems, f func(string) string) {
	p.name(f("quota"), it.Quota)
	p.amount(f("unused"), it.Unused)
	p.amount(f("demand"), it.Demand)
	p.weight(f("weight"), it.Weight)
	it.Bounds.check(p, f(""))
	p.amount(f("confirmed_cap"), it.ConfirmedCap)
	p.amount(f("confirmed_rate"), it.ConfirmedRate)
}

func (c Release) validate() error {
	var p problems
	p.time("now", c.Now)
	p.name("holder", c.Holder)
	p.seq(c.Seq)
	if c.LeaseID == 0 {
		p.addf("lease_id must be > 0")
	}
	p.amount("unused", c.Unused)
	return p.err(fmt.Sprintf("release %d by %q", c.LeaseID, c.Holder))
}

func (c Tick) validate() error {
	var p problems
	p.time("now", c.Now)
	return p.err("tick")
}

func (c LeaderElected) validate() error {
	var p problems
	p.time("now", c.Now)
	return p.err("leader elected")
}

// value returns the command as a value of its concrete type, so pointer and
// value forms behave the same; nil (also a typed nil pointer) gives nil.
func value(c Command) Command {
	switch v := c.(type) {
	case *ConfigureQuota:
		if v != nil {
			return *v
		}
	case *Grant:
		if v != nil {
			return *v
		}
	case *Renew:
		if v != nil {
			return *v
		}
	case *Release:
		if v != nil {
			return *v
		}
	case *Tick:
		if v != nil {
			return *v
		}
	case *LeaderElected:
		if v != nil {
			return *v
		}
	case *Fund:
		if v != nil {
			return *v
		}
	case *Tune:
		if v != nil {
			return *v
		}
	case ConfigureQuota, Grant, Renew, Release, Tick, LeaderElected, Fund, Tune:
		return v
	}
	return nil
}

// weightOr1 applies the default weight.
func weightOr1(w float64) float64 {
	if w == 0 {
		return 1
	}
	return w
}

// finite reports whether v is a usable number.
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
