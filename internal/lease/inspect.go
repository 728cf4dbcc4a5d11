package lease

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// QuotaInfo is a read-only view of one quota, for the admin API, metrics
// and tests.
type QuotaInfo struct {
	Name string
	// QuotaConfig is the shape ConfigureQuota set. For a funded quota,
	// Burst and Rate are its own part only: Effective adds Fund.
	QuotaConfig
	Fund Funding
	// Pool is P, the unassigned tokens, as of PoolAt (it refills lazily).
	Pool   float64
	PoolAt int64
	// CeilBurst and CeilRate are what conservation is held to right now:
	// B and r, or more while a lowered B or r still has larger leases
	// outstanding. Only ConfigureQuota raises them.
	CeilBurst float64
	CeilRate  float64
	// ReservedCap and ReservedRate are sum(reserved b_i) and sum(reserved r_i).
	ReservedCap  float64
	ReservedRate float64
	Leases       int
}

// Effective is the shape conservation is held to: the configured shape plus
// the funding of a funded quota.
func (q QuotaInfo) Effective() QuotaConfig {
	c := q.QuotaConfig
	c.Burst += q.Fund.Burst
	c.Rate += q.Fund.Rate
	return c
}

// LeaseInfo is a read-only view of one lease.
type LeaseInfo struct {
	// Lease holds the latest answer's terms (Balance is always 0 here).
	Lease
	// ReservedCap and ReservedRate are the sizes counted against the quota
	// (larger than Cap and Rate while a shrink is unconfirmed), until
	// ReservedUntil.
	ReservedCap   float64
	ReservedRate  float64
	ReservedUntil int64
	ReclaimAt     int64
	// Bound is the upper bound of the holder's unspent tokens, as of BoundAt.
	Bound   float64
	BoundAt int64
	Demand  float64
	Weight  float64
}

// Tunings lists the operators' tunings, sorted by rule then region.
func (s *State) Tunings() []Tuning {
	out := make([]Tuning, 0, len(s.tunings))
	for _, k := range sortedKeys(s.tunings) {
		out = append(out, s.tunings[k])
	}
	return out
}

// Tuning returns the effective tuning of rule in region: the region's own
// over the rule's default (region ""). ok is false when neither is set.
func (s *State) Tuning(rule, region string) (Tuning, bool) {
	d, okD := s.tunings[rule+"/"]
	if region == "" {
		return d, okD
	}
	r, okR := s.tunings[rule+"/"+region]
	if !okR {
		return d, okD
	}
	return r.Over(d), true
}

// Quotas lists the quota names, sorted.
func (s *State) Quotas() []string { return slices.Sorted(maps.Keys(s.quotas)) }

// RangeQuotas calls fn with every quota whose name starts with prefix, in
// no particular order, without sorting every name as Quotas does.
func (s *State) RangeQuotas(prefix string, fn func(QuotaInfo)) {
	for name := range s.quotas {
		if strings.HasPrefix(name, prefix) {
			q, _ := s.Quota(name)
			fn(q)
		}
	}
}

// NumQuotas is the number of quotas the state holds.
func (s *State) NumQuotas() int { return len(s.quotas) }

// Subjects is the number of quotas of rule (QuotaConfig.Rule) the state
// holds: what MaxSubjects bounds.
func (s *State) Subjects(rule string) int { return s.subjects[rule] }

// Quota describes one quota.
func (s *State) Quota(name string) (QuotaInfo, bool) {
	q := s.quotas[name]
	if q == nil {
		return QuotaInfo{}, false
	}
	resCap, resRate := q.reserved()
	return QuotaInfo{
		Name: name, QuotaConfig: q.base, Fund: q.fund, Pool: q.pool, PoolAt: q.poolAt,
		CeilBurst: q.ceilBurst, CeilRate: q.ceilRate,
		ReservedCap: resCap, ReservedRate: resRate, Leases: len(q.leases),
	}, true
}

// Leases describes the leases of one quota, in the state's (creation) order.
func (s *State) Leases(quota string) []LeaseInfo {
	q := s.quotas[quota]
	if q == nil {
		return nil
	}
	out := make([]LeaseInfo, len(q.leases))
	for i, l := range q.leases {
		out[i] = l.info()
	}
	return out
}

// LeaseByID describes one lease.
func (s *State) LeaseByID(id uint64) (LeaseInfo, bool) {
	l := s.leases[id]
	if l == nil {
		return LeaseInfo{}, false
	}
	return l.info(), true
}

// LastSeq is the holder's last applied sequence number, if it is still
// remembered (see RecordTTL).
func (s *State) LastSeq(holder string) (uint64, bool) {
	h := s.holders[holder]
	if h == nil {
		return 0, false
	}
	return h.seq, true
}

func (l *lease) info() LeaseInfo {
	return LeaseInfo{
		Lease: Lease{
			ID: l.ID, Quota: l.Quota, Holder: l.Holder, Cap: l.Cap, Rate: l.Rate,
			Expiry: l.Expiry, Term: l.Term,
		},
		ReservedCap: l.ResCap, ReservedRate: l.ResRate, ReservedUntil: l.ResUntil,
		ReclaimAt: l.ReclaimAt, Bound: l.Bound, BoundAt: l.BoundAt,
		Demand: l.Demand, Weight: l.Weight,
	}
}

// Clone returns a deep copy that shares nothing with s.
func (s *State) Clone() *State {
	c := &State{
		now: s.now, nextID: s.nextID,
		quotas:   make(map[string]*quota, len(s.quotas)),
		leases:   make(map[uint64]*lease, len(s.leases)),
		holders:  make(map[string]*holder, len(s.holders)),
		tunings:  make(map[string]Tuning, len(s.tunings)),
		subjects: maps.Clone(s.subjects),
	}
	for k, t := range s.tunings {
		c.tunings[k] = t.clone()
	}
	for name, h := range s.holders {
		hc := *h
		hc.answer = h.answer.clone()
		c.holders[name] = &hc
	}
	for name, q := range s.quotas {
		qc := *q
		qc.leases = make([]*lease, len(q.leases))
		qc.byHolder = make(map[string]*lease, len(q.byHolder))
		for i, l := range q.leases {
			lc := *l
			lc.Bounds = l.Bounds.clone()
			qc.leases[i] = &lc
			qc.byHolder[lc.Holder] = &lc
			c.leases[lc.ID] = &lc
		}
		qc.rebuild(s.now)
		c.quotas[name] = &qc
	}
	return c
}

// tolerance is the rounding allowed in a sum of n terms of magnitude up to
// scale: far below one token for any quota of realistic size.
func tolerance(scale float64, n int) float64 {
	return 1e-12 * max(1, scale) * float64(n+2)
}

// CheckInvariants verifies the state's invariants and returns every
// violation found (nil if none). For every quota, with reserved sizes
// (the larger of old and new while a shrink is unconfirmed):
//
//	P + sum(reserved b_i) <= CeilBurst   and   sum(reserved r_i) <= CeilRate
//
// where the ceilings are B and r except while a configuration change has
// left more leased than they allow (and P is then 0). Also: 0 <= P <= the
// pool's room B - sum(reserved b_i); 0 <= b_i <= reserved b_i;
// 0 <= r_i <= reserved r_i; 0 <= bound <= reserved b_i; expiry <= reclaim
// time; one lease per holder per quota; and the indexes agree.
func (s *State) CheckInvariants() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.nextID == 0 {
		bad("next lease id is 0")
	}
	if s.now < 0 || s.now > MaxTime {
		bad("now %d out of range", s.now)
	}
	counted := map[string]int{}
	subjects := map[string]int{}
	nLeases := 0
	for _, name := range s.Quotas() {
		q := s.quotas[name]
		if q.name != name {
			bad("quota %q is filed under %q", q.name, name)
		}
		if err := q.cfg.Validate(); err != nil {
			bad("quota %q: %v", name, err)
		}
		if q.base.Rule != "" {
			subjects[q.base.Rule]++
		}
		if q.cfg != q.effective() || !q.base.Funded && q.fund != (Funding{}) {
			bad("quota %q: shape %+v is not its configuration %+v plus its funding %+v", name, q.cfg, q.base, q.fund)
		}
		resCap, resRate := q.reserved()
		tolB := tolerance(max(q.cfg.Burst, q.ceilBurst), len(q.leases))
		tolR := tolerance(max(q.cfg.Rate, q.ceilRate), len(q.leases))
		switch {
		case !finite(q.pool) || q.pool < 0:
			bad("quota %q: pool %v is negative or not finite", name, q.pool)
		case q.pool > max(0, q.cfg.Burst-resCap)+tolB:
			bad("quota %q: pool %v exceeds its room B %v - reserved %v", name, q.pool, q.cfg.Burst, resCap)
		}
		if !(q.ceilBurst >= q.cfg.Burst) || !(q.ceilRate >= q.cfg.Rate) {
			bad("quota %q: ceilings (%v, %v) below B %v, r %v", name, q.ceilBurst, q.ceilRate, q.cfg.Burst, q.cfg.Rate)
		}
		if !(q.pool+resCap <= q.ceilBurst+tolB) {
			bad("quota %q: conservation: P %v + reserved caps %v = %v > burst ceiling %v (B %v)",
				name, q.pool, resCap, q.pool+resCap, q.ceilBurst, q.cfg.Burst)
		}
		if !(resRate <= q.ceilRate+tolR) {
			bad("quota %q: conservation: reserved rates %v > rate ceiling %v (r %v)", name, resRate, q.ceilRate, q.cfg.Rate)
		}
		if q.poolAt > s.now {
			bad("quota %q: pool refilled at %d, after now %d", name, q.poolAt, s.now)
		}
		for _, msg := range q.checkAgg(s.now) {
			bad("quota %q: aggregates: %s", name, msg)
		}
		if len(q.byHolder) != len(q.leases) {
			bad("quota %q: %d leases but %d holders", name, len(q.leases), len(q.byHolder))
		}
		for _, l := range q.leases {
			nLeases++
			counted[l.Holder]++
			errs = append(errs, s.checkLease(q, l, tolB)...)
		}
	}
	if nLeases != len(s.leases) {
		bad("%d leases in quotas, %d by id", nLeases, len(s.leases))
	}
	if !maps.Equal(subjects, s.subjects) {
		bad("quotas per rule are %v, counted %v", subjects, s.subjects)
	}
	for name, h := range s.holders {
		if h.leases != counted[name] {
			bad("holder %q: counts %d leases, has %d", name, h.leases, counted[name])
		}
		if h.seq == 0 || h.answer.Code >= codeLimit {
			bad("holder %q: seq %d, answer code %d", name, h.seq, h.answer.Code)
		}
		if k := h.answer.Kind; k != KindGrant && k != KindRenew && k != KindRelease {
			bad("holder %q: recorded answer of kind %s", name, k)
		}
		for _, it := range h.answer.Items {
			if it.Code >= codeLimit {
				bad("holder %q: recorded item answer code %d", name, it.Code)
			}
		}
	}
	for name := range counted {
		if s.holders[name] == nil {
			bad("holder %q has leases but no record", name)
		}
	}
	return errors.Join(errs...)
}

func (s *State) checkLease(q *quota, l *lease, tol float64) []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("quota %q lease %d: "+format, append([]any{q.name, l.ID}, args...)...))
	}
	if l.Quota != q.name || q.byHolder[l.Holder] != l || s.leases[l.ID] != l {
		bad("indexes disagree (quota %q, holder %q)", l.Quota, l.Holder)
	}
	if l.ID == 0 || l.ID >= s.nextID {
		bad("id out of range (next %d)", s.nextID)
	}
	for _, v := range []float64{l.Cap, l.Rate, l.ResCap, l.ResRate, l.Bound, l.Demand, l.Weight} {
		if !finite(v) || v < 0 {
			bad("negative or non-finite field %v", v)
			return errs
		}
	}
	if l.Cap > l.ResCap || l.Rate > l.ResRate {
		bad("sizes (%v, %v) above reserved (%v, %v)", l.Cap, l.Rate, l.ResCap, l.ResRate)
	}
	if l.Bound > l.ResCap+tol {
		bad("bound %v above reserved cap %v", l.Bound, l.ResCap)
	}
	if l.Expiry > l.ReclaimAt {
		bad("expiry %d after reclaim %d", l.Expiry, l.ReclaimAt)
	}
	if l.BoundAt > s.now {
		bad("bound at %d after now %d", l.BoundAt, s.now)
	}
	if !(l.Weight >= MinWeight && l.Weight <= MaxWeight) || math.IsNaN(l.Demand) || l.Demand > MaxValue {
		bad("weight %v or demand %v out of range", l.Weight, l.Demand)
	}
	return errs
}

func (t Tuning) clone() Tuning {
	if t.MinSlice != nil {
		v := *t.MinSlice
		t.MinSlice = &v
	}
	if t.MaxSlice != nil {
		v := *t.MaxSlice
		t.MaxSlice = &v
	}
	if t.SafeShare != nil {
		v := *t.SafeShare
		t.SafeShare = &v
	}
	if t.SafePrev != nil {
		v := *t.SafePrev
		t.SafePrev = &v
	}
	return t
}

// HoldersWithLeases lists, sorted, the holders for which match is true that
// have at least one lease on record (live, or expired and not yet
// reclaimed). It scans every holder remembered.
func (s *State) HoldersWithLeases(match func(holder string) bool) []string {
	var out []string
	for name, h := range s.holders {
		if h.leases > 0 && match(name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
