package lease

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ration-dev/ration/internal/admission"
)

// TestHierarchyProperties runs two levels of state machine: an upper State
// with quota Q = (B, r), a region holding a lease on Q through Holding and
// funding a lower State's funded quota with it (Fund: cap, rate, deposit,
// NotAfter = its validity), as the coordinator's upstream loop does, and
// agents holding subleases on the lower quota and spending them. Replies
// are delayed, lost and reordered; the region and the agents renew at
// random times with random demands, and the region may be cut off for
// long stretches. Whatever happens, what the agents spend in any window
// [t0, t1] is at most (B + own B) + (r + own r) x (t1 - t0), own being the
// lower quota's own part (a safe share), and both states keep their
// invariants after every step.
func TestHierarchyProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		h := newHier(rt)
		for range rapid.IntRange(300, 2000).Draw(rt, "steps") {
			h.step()
		}
		h.check()
	})
}

type hierReply struct {
	at    int64 // delivered at
	agent int   // -1: the region
	seq   uint64
	l     *Lease
}

type hier struct {
	t            *rapid.T
	up, low      *State
	now          int64
	period, marg int64
	burst, rate  float64
	own          Share2
	region       Holding
	regionSeq    uint64
	confCap      float64
	confRate     float64
	cut          bool
	agents       []*Holding
	upper        []bool // agent i holds on the upper state (another region's consumer)
	agentSeq     []uint64
	demand       []float64
	replies      []hierReply
	rec          []admission.Record
	// cfg is each state's quota shape, which grants carry (Tick removes
	// an idle quota; the grant recreates it).
	cfg map[*State]QuotaConfig
}

// Share2 is a (burst, rate) pair (region.Share, without the import).
type Share2 struct{ Burst, Rate float64 }

func newHier(t *rapid.T) *hier {
	h := &hier{t: t, up: New(), low: New(), now: 1000 * sec}
	h.period = rapid.Int64Range(sec/2, 3*sec).Draw(t, "period")
	h.marg = rapid.Int64Range(0, sec/2).Draw(t, "margin")
	h.burst = rapid.Float64Range(1, 200).Draw(t, "burst")
	h.rate = rapid.Float64Range(1, 100).Draw(t, "rate")
	if rapid.Bool().Draw(t, "own part") {
		h.own = Share2{rapid.Float64Range(0, 20).Draw(t, "own burst"), rapid.Float64Range(0, 10).Draw(t, "own rate")}
		if h.own.Rate < MinRate {
			h.own.Rate = 0
		}
	}
	up := ConfigureQuota{Now: h.now, Quota: "g", Burst: h.burst, Rate: h.rate, LeasePeriod: h.period, SafetyMargin: h.marg}
	low := ConfigureQuota{Now: h.now, Quota: "g", Burst: h.own.Burst, Rate: h.own.Rate,
		LeasePeriod: rapid.Int64Range(sec/4, 3*sec).Draw(t, "sub period"), SafetyMargin: h.marg, Funded: true}
	h.cfg = map[*State]QuotaConfig{h.up: up.Config(), h.low: low.Config()}
	h.apply(h.up, up)
	h.apply(h.low, low)
	h.region = Holding{Quota: "g"}
	h.regionSeq = 1
	for i := range rapid.IntRange(1, 4).Draw(t, "agents") {
		h.agents = append(h.agents, &Holding{Quota: "g"})
		// The first agent takes from the upper quota directly: it competes
		// with the region, so a region that overspent would show.
		h.upper = append(h.upper, i == 0)
		h.agentSeq = append(h.agentSeq, 1)
		h.demand = append(h.demand, 0)
	}
	return h
}

func (h *hier) apply(s *State, c Command) Result {
	r, err := s.Apply(c)
	if err != nil {
		h.t.Fatalf("Apply(%+v) = %v", c, err)
	}
	for _, st := range []*State{h.up, h.low} {
		if err := st.CheckInvariants(); err != nil {
			h.t.Fatalf("after %+v: %v", c, err)
		}
	}
	return r
}

// deliver hands a reply to its holder: the region adopts and funds the
// lower quota (Fund stamped when applied, NotAfter its validity); an agent
// adopts.
func (h *hier) deliver(rp hierReply) {
	if rp.l == nil {
		return
	}
	if rp.agent >= 0 {
		h.agents[rp.agent].Adopt(h.now, rp.seq, *rp.l)
		return
	}
	if !h.region.Adopt(h.now, rp.seq, *rp.l) || !h.region.Valid(h.now) {
		return
	}
	rate := rp.l.Rate
	if rate < MinRate {
		rate = 0
	}
	if _, ok := h.low.Quota("g"); !ok {
		// Removed while idle (its funding had dropped): the coordinator's
		// Fund is refused then, and a sublease grant recreates the quota.
		return
	}
	h.apply(h.low, Fund{Now: h.now, Quota: "g", Burst: rp.l.Cap, Rate: rate, Deposit: rp.l.Balance, NotAfter: h.region.ValidUntil})
}

func (h *hier) send(agent int, answer func() *Lease, seq uint64) {
	l := answer()
	delay := rapid.Int64Range(0, sec/5).Draw(h.t, "delay")
	if rapid.IntRange(0, 9).Draw(h.t, "lose") == 0 {
		return
	}
	h.replies = append(h.replies, hierReply{at: h.now + delay, agent: agent, seq: seq, l: l})
}

func (h *hier) step() {
	t := h.t
	switch rapid.IntRange(0, 10).Draw(t, "action") {
	case 0, 1, 10: // time passes; replies due are delivered, in a random order
		h.now += rapid.Int64Range(1, sec/3).Draw(t, "dt")
		var due []hierReply
		h.replies = slices.DeleteFunc(h.replies, func(r hierReply) bool {
			if r.at <= h.now {
				due = append(due, r)
				return true
			}
			return false
		})
		for _, i := range rapid.Permutation(due).Draw(t, "order") {
			h.deliver(i)
		}
	case 2: // the region renews upstream (unless cut off)
		if h.cut {
			return
		}
		var demand float64
		for _, l := range h.low.Leases("g") {
			demand += l.Demand
		}
		seq := h.regionSeq
		h.regionSeq++
		if !h.region.Valid(h.now) {
			h.region.Drop()
			h.confCap, h.confRate = 0, 0
			g := h.region.Grant(h.now, "region", seq, demand)
			g.Config = ptrTo(h.cfg[h.up])
			h.send(-1, func() *Lease { g.Now = h.now; return h.apply(h.up, g).Lease }, seq)
			return
		}
		q, _ := h.low.Quota("g")
		b, r := q.Burst+h.region.Lease.Cap, q.Rate+h.region.Lease.Rate
		if q.CeilBurst <= b+1e-9*max(1, b) && q.CeilRate <= r+1e-9*max(1, r) {
			h.confCap, h.confRate = h.region.Lease.Cap, h.region.Lease.Rate
		}
		it := h.region.Renewal(h.now, seq, demand, 0)
		it.Unused, it.ConfirmedCap, it.ConfirmedRate = 0, h.confCap, h.confRate
		h.send(-1, func() *Lease {
			res := h.apply(h.up, Renew{Now: h.now, Holder: "region", Seq: seq, Items: []RenewItem{it}})
			return res.Items[0].Lease
		}, seq)
	case 3: // the region is cut off, or heals (rarely: cuts last)
		if rapid.IntRange(0, 4).Draw(t, "flip") == 0 {
			h.cut = !h.cut
		}
	case 4, 5: // an agent asks for or renews its sublease
		i := rapid.IntRange(0, len(h.agents)-1).Draw(t, "agent")
		a := h.agents[i]
		h.demand[i] = rapid.Float64Range(0, 2*h.rate).Draw(t, "demand")
		if h.upper[i] {
			h.demand[i] = 2 * h.rate // greedy: takes whatever the region leaves
		}
		seq := h.agentSeq[i]
		h.agentSeq[i]++
		name := fmt.Sprintf("a%d", i)
		st := h.low
		if h.upper[i] {
			st = h.up
		}
		if !a.Valid(h.now) {
			a.Drop()
			g := a.Grant(h.now, name, seq, h.demand[i])
			g.Config = ptrTo(h.cfg[st])
			h.send(i, func() *Lease { g.Now = h.now; return h.apply(st, g).Lease }, seq)
			return
		}
		it := a.Renewal(h.now, seq, h.demand[i], rapid.Float64Range(0, 2).Draw(t, "surrender"))
		h.send(i, func() *Lease {
			res := h.apply(st, Renew{Now: h.now, Holder: name, Seq: seq, Items: []RenewItem{it}})
			return res.Items[0].Lease
		}, seq)
	case 6, 7, 8: // agents spend what they can
		for i, a := range h.agents {
			cost := rapid.Float64Range(0.1, 5).Draw(t, "cost")
			for a.Spend(h.now, cost) {
				h.rec = append(h.rec, admission.Record{At: time.Duration(h.now) * time.Microsecond, Quota: "g",
					Cost: cost, Allowed: true, Agent: fmt.Sprint(i)})
			}
		}
	case 9: // both leaders tick
		h.apply(h.up, Tick{Now: h.now})
		h.apply(h.low, Tick{Now: h.now})
	}
}

func (h *hier) check() {
	rep := admission.Check(h.rec, "g", h.burst+h.own.Burst, h.rate+h.own.Rate)
	if rep.Overshoot > 1e-6*(h.burst+h.own.Burst) {
		h.t.Fatalf("agents spent %.4f tokens above (B + own B) + (r + own r) x T in [%v, %v] (B %v, r %v, own %+v)",
			rep.Overshoot, rep.From, rep.To, h.burst, h.rate, h.own)
	}
}

func ptrTo[T any](v T) *T { return &v }
