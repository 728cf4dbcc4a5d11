package coordinator

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/region"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Operators' run-time tuning (docs/operations.md). The table lives in the
// replicated lease state (lease.Tune), so it is committed through Raft,
// kept in snapshots and across restarts, and read by every leader. It is
// applied where the commands for a quota are built:
//
//   - every group: the tuning of (rule, -region), over the rule's default
//     (region ""), replaces the rule file's lease period and slices in the
//     quota's ConfigureQuota: the next renewal reconfigures the quota;
//   - the global group: region R's tuning gives R's upstream lease its
//     weight and its own period and slice bounds (lease.Bounds), at R's
//     next renewal;
//   - a regional group: the renew point of its upstream lease.
//
// None of these can break conservation: they only size leases within the
// quota. A region's safe share is tuned on the global group and reaches
// the region in two phases (safe.go).

// Tune implements rationv1.AdminServer.
func (s *adminServer) Tune(ctx context.Context, req *rationv1.TuneRequest) (*rationv1.TuneResponse, error) {
	n := s.n
	if err := n.servable(); err != nil {
		return nil, n.rpcError(ctx, err)
	}
	n.tuneMu.Lock()
	defer n.tuneMu.Unlock()
	t, err := n.checkTuning(req.GetTuning(), req.GetClear(), req.GetAllowOvershoot())
	if err != nil {
		return nil, n.rpcError(ctx, err)
	}
	res, err := n.propose(ctx, &proposal{ops: []pendingOp{{cmd: lease.Tune{Tuning: t, Clear: req.GetClear()}}}})
	if err != nil {
		return nil, n.rpcError(ctx, err)
	}
	if res[0].Err != nil {
		return nil, n.rpcError(ctx, res[0].Err)
	}
	verb := "set"
	if req.GetClear() {
		verb = "cleared"
	}
	n.logger.Info("tuning "+verb, "rule", t.Rule, "region", t.Region, "tuning", fmt.Sprintf("%+v", tuningProto(t)))
	if t.SafeShare != nil {
		if r, ok := n.rules.Load().Rule(t.Rule); ok {
			if o := region.Overshoot(r.Burst, r.Rate, n.countedRegions(r)); o.Rate > 0 || o.Burst > 0 {
				n.logger.Warn("safe share accepted with allow_overshoot: regions cut off from the global group may overshoot",
					"rule", r.Name, "region", t.Region, "overshoot_tokens_per_second", o.Rate, "overshoot_tokens", o.Burst)
			}
		}
	}
	var eff lease.Tuning
	n.fsm.read(func(st *lease.State) { eff, _ = st.Tuning(t.Rule, t.Region) })
	eff.Rule, eff.Region = t.Rule, t.Region
	return &rationv1.TuneResponse{Tuning: tuningProto(eff)}, nil
}

// ListTunings implements rationv1.AdminServer.
func (s *adminServer) ListTunings(ctx context.Context, _ *rationv1.ListTuningsRequest) (*rationv1.ListTuningsResponse, error) {
	resp := &rationv1.ListTuningsResponse{}
	s.n.fsm.read(func(st *lease.State) {
		for _, t := range st.Tunings() {
			resp.Tunings = append(resp.Tunings, tuningProto(t))
		}
	})
	return resp, nil
}

// checkTuning turns a request into a lease.Tuning, reporting every problem
// at once, each naming its field and value.
func (n *Node) checkTuning(p *rationv1.Tuning, clear, allowOvershoot bool) (lease.Tuning, error) {
	if p == nil {
		return lease.Tuning{}, fmt.Errorf("%w: tuning: required", ErrInvalidRequest)
	}
	var ps []string
	bad := func(format string, args ...any) { ps = append(ps, fmt.Sprintf(format, args...)) }
	t := lease.Tuning{Rule: p.GetRule(), Region: p.GetRegion()}
	var r *rules.Rule
	if t.Rule == "" {
		bad("rule: required")
	} else if rr, ok := n.rules.Load().Rule(t.Rule); !ok {
		bad("rule %q: not in this coordinator's rules", t.Rule)
	} else if !rr.Mode.Leases() {
		bad("rule %q: mode is %v; only leased and auto rules have lease settings", t.Rule, rr.Mode)
	} else {
		r = rr
	}
	if t.Region != "" {
		// A tuning no group would read is refused: it would sit in the
		// table looking in force. A regional group reads its own
		// region's; the global group a scope: global rule's regions'.
		switch msg := region.ID(t.Region).Check(); {
		case msg != "":
			bad("region: %s", msg)
		case n.cfg.Region != "" && t.Region != n.cfg.Region:
			bad("region %q: this is region %q's group, which reads only its own region's tuning (or the rule's, without -region); tune region %q on its own group, or its upstream lease on the global group",
				t.Region, n.cfg.Region, t.Region)
		case r != nil && r.Scope == region.ScopeGlobal:
			if _, ok := r.Regions[region.ID(t.Region)]; !ok {
				bad("region %q: rule %q is scope: global and has no share for it (its regions: %s)", t.Region, t.Rule, regionList(r))
			}
		case r != nil && n.cfg.Region == "":
			bad("region %q: rule %q is not scope: global, and this group serves no region: no group would read the tuning (leave -region out to tune the rule here)", t.Region, t.Rule)
		}
	}
	if p.LeasePeriodMs != nil {
		d := time.Duration(p.GetLeasePeriodMs()) * time.Millisecond
		if d <= 0 || d.Microseconds() > lease.MaxPeriod {
			bad("lease_period_ms %d: must be in [1, %d]", p.GetLeasePeriodMs(), lease.MaxPeriod/1000)
		} else {
			t.LeasePeriod = d.Microseconds()
		}
	}
	if p.RenewAt != nil {
		if v := p.GetRenewAt(); !(v > 0 && v < 1) {
			bad("renew_at %v: must be in (0, 1)", v)
		} else {
			t.RenewAt = v
		}
	}
	slice := func(name string, v *float64) *float64 {
		if v == nil {
			return nil
		}
		if !(*v >= 0 && *v <= lease.MaxValue) {
			bad("%s %v: must be in [0, %g] tokens/s", name, *v, float64(lease.MaxValue))
			return nil
		}
		if r != nil && *v > r.Rate && r.Rate > 0 && name == "min_slice" {
			bad("%s %v: exceeds the rule's rate %v; no slice could be granted", name, *v, r.Rate)
			return nil
		}
		c := *v
		return &c
	}
	t.MinSlice = slice("min_slice", p.MinSlice)
	t.MaxSlice = slice("max_slice", p.MaxSlice)
	if t.MinSlice != nil && t.MaxSlice != nil && *t.MaxSlice != 0 && *t.MaxSlice < *t.MinSlice {
		bad("max_slice %v: below min_slice %v (0 means no maximum)", *t.MaxSlice, *t.MinSlice)
	}
	if p.Weight != nil {
		if v := p.GetWeight(); !(v >= lease.MinWeight && v <= lease.MaxWeight) {
			bad("weight %v: must be in [%g, %g]", v, float64(lease.MinWeight), float64(lease.MaxWeight))
		} else {
			t.Weight = v
		}
	}
	if p.SafeShare != nil {
		if clear {
			bad("safe_share: cannot be cleared; set it to another value instead")
		} else if prev, ok := n.checkSafeTune(r, t.Region, p.GetSafeShare(), allowOvershoot, bad); ok {
			v := p.GetSafeShare()
			t.SafeShare, t.SafePrev = &v, &prev
		}
	}
	if p.SafeSharePendingFrom != nil {
		bad("safe_share_pending_from: set by the coordinator, not by a Tune")
	}
	if !clear && len(ps) == 0 && t.Empty() {
		bad("nothing to set: give lease_period_ms, renew_at, min_slice, max_slice, weight or safe_share (or clear)")
	}
	if len(ps) > 0 {
		return lease.Tuning{}, fmt.Errorf("%w: %s", ErrInvalidRequest, strings.Join(ps, "; "))
	}
	return t, nil
}

func tuningProto(t lease.Tuning) *rationv1.Tuning {
	p := &rationv1.Tuning{Rule: t.Rule, Region: t.Region, MinSlice: t.MinSlice, MaxSlice: t.MaxSlice}
	if t.LeasePeriod != 0 {
		ms := t.LeasePeriod / 1000
		p.LeasePeriodMs = &ms
	}
	if t.RenewAt != 0 {
		p.RenewAt = &t.RenewAt
	}
	if t.Weight != 0 {
		p.Weight = &t.Weight
	}
	if t.SafeShare != nil {
		v := *t.SafeShare
		p.SafeShare = &v
		if t.SafePrev != nil {
			pv := *t.SafePrev
			p.SafeSharePendingFrom = &pv
		}
	}
	return p
}

// tuningOf reads the effective tuning of rule in reg (over the default).
// Renewals read it for every item: it answers from n.tunings while the
// FSM's tunings are those it was filled from (FSM.tuneGen), without the
// FSM's lock, which an entry being applied holds for milliseconds.
func (n *Node) tuningOf(rule, reg string) lease.Tuning {
	c := &n.tunings
	key := [2]string{rule, reg}
	gen := n.fsm.tuneGen.Load()
	c.mu.Lock()
	t, ok := c.m[key]
	ok = ok && c.gen == gen
	c.mu.Unlock()
	if ok {
		return t
	}
	n.fsm.read(func(s *lease.State) {
		t, _ = s.Tuning(rule, reg)
		gen = n.fsm.tuneGen.Load() // the generation t is of
	})
	c.mu.Lock()
	if c.gen != gen || c.m == nil {
		c.gen, c.m = gen, map[[2]string]lease.Tuning{}
	}
	c.m[key] = t
	c.mu.Unlock()
	return t
}

// tuningCache holds effective tunings by rule and region, of the FSM's
// tunings generation gen.
type tuningCache struct {
	mu  sync.Mutex
	gen uint64
	m   map[[2]string]lease.Tuning
}

// tuneQuota applies the quota-level tuning to a quota's shape.
func tuneQuota(c *lease.ConfigureQuota, t lease.Tuning) {
	if t.LeasePeriod != 0 {
		c.LeasePeriod = t.LeasePeriod
	}
	if t.MinSlice != nil {
		c.MinSlice = *t.MinSlice
	}
	if t.MaxSlice != nil {
		c.MaxSlice = *t.MaxSlice
	}
	if c.MaxSlice != 0 && c.MaxSlice < c.MinSlice {
		c.MaxSlice = c.MinSlice // a tuned min above the file's max: the min wins
	}
}

// regionBounds turns a region's tuning into its lease's own bounds; nil
// when the region has no period or slice of its own.
func regionBounds(t lease.Tuning, c lease.ConfigureQuota) *lease.Bounds {
	if t.LeasePeriod == 0 && t.MinSlice == nil && t.MaxSlice == nil {
		return nil
	}
	b := &lease.Bounds{Period: t.LeasePeriod, MinSlice: c.MinSlice, MaxSlice: c.MaxSlice}
	if t.MinSlice != nil {
		b.MinSlice = *t.MinSlice
	}
	if t.MaxSlice != nil {
		b.MaxSlice = *t.MaxSlice
	}
	if b.MaxSlice != 0 && b.MaxSlice < b.MinSlice {
		b.MaxSlice = b.MinSlice
	}
	return b
}

// regionList names a global rule's regions, sorted, for refusals.
func regionList(r *rules.Rule) string {
	ids := make([]string, 0, len(r.Regions))
	for id := range r.Regions {
		ids = append(ids, string(id))
	}
	sort.Strings(ids)
	return strings.Join(ids, ", ")
}
