package lease

import (
	"fmt"
	"testing"

	"pgregory.net/rapid"
)

// handOver is a region cut off from the global group, on the state
// machine alone: its funded quota "g" holds an own part (a safe share) and
// one upstream funding whose NotAfter is never renewed. Agents keep the
// Holding rules (drift and pause as the agent's defaults), renew at their
// renew point, and get every answer rtt after sending.
type handOver struct {
	period   int64 // the quota's lease period
	own      Share2
	fund     Share2
	agents   int
	rtt      int64
	renewAt  float64 // fraction of the validity, as holder.Options.RenewAt
	fundLeft int64   // NotAfter - now when the cut starts
}

type hoAgent struct {
	name    string
	h       Holding
	seq     uint64
	inAt    int64 // when the answer in flight arrives (0: none)
	inSeq   uint64
	inLease *Lease
	renewAt int64
}

const (
	hoDrift = 0.001
	hoPause = 50_000 // µs: the agent's default longest pause
	hoStep  = 1_000  // µs
)

// run plays the cut from t0 to NotAfter + 2 periods and reports the first
// moment an agent that had a lease held none, and the sum of the caps the
// agents spend under one period after NotAfter.
func (c handOver) run(t *testing.T) (gapAt int64, gapAgent string, capsAfter float64) {
	t.Helper()
	s := New()
	const t0 = 1000 * sec
	notAfter := t0 + c.fundLeft
	cfg := ConfigureQuota{Now: t0, Quota: "g", Burst: c.own.Burst, Rate: c.own.Rate,
		LeasePeriod: c.period, SafetyMargin: c.period / 10, Funded: true}
	mustApply(t, s, cfg)
	mustApply(t, s, Fund{Now: t0, Quota: "g", Burst: c.fund.Burst, Rate: c.fund.Rate, Deposit: c.fund.Burst, NotAfter: notAfter})
	validity := func(term int64) int64 { return AgentValidity(term, hoDrift, hoPause) }
	agents := make([]*hoAgent, c.agents)
	for i := range agents {
		agents[i] = &hoAgent{name: fmt.Sprintf("a%d", i), h: Holding{Quota: "g", Validity: validity}, seq: 1}
	}
	had := map[string]bool{}
	gapAt = -1
	for now := t0; now <= notAfter+2*c.period; now += hoStep {
		for _, a := range agents {
			if a.inAt != 0 && now >= a.inAt {
				if a.inLease == nil {
					a.h.Drop()
				} else {
					a.h.Adopt(now, a.inSeq, *a.inLease)
					v := validity(a.h.Lease.Term)
					a.renewAt = a.h.ValidUntil - int64(float64(v)*(1-c.renewAt))
				}
				a.inAt = 0
			}
			if a.h.Valid(now) {
				had[a.name] = true
			} else if had[a.name] && gapAt < 0 {
				gapAt, gapAgent = now, a.name
			}
			if a.inAt != 0 || a.h.Lease.ID != 0 && a.h.Valid(now) && now < a.renewAt {
				continue
			}
			seq := a.seq
			a.seq++
			if a.h.Lease.ID == 0 || !a.h.Valid(now) {
				a.h.Drop()
				g := a.h.Grant(now, a.name, seq, 30)
				g.Config = ptrTo(cfg.Config())
				g.Now = now
				a.inAt, a.inSeq, a.inLease = now+c.rtt, seq, mustApply(t, s, g).Lease
				continue
			}
			it := a.h.Renewal(now, seq, 30, 0)
			res := mustApply(t, s, Renew{Now: now, Holder: a.name, Seq: seq, Items: []RenewItem{it}})
			a.inAt, a.inSeq, a.inLease = now+c.rtt, seq, res.Items[0].Lease
		}
		if (now-t0)%(100*1000) == 0 {
			mustApply(t, s, Tick{Now: now})
		}
		if now == notAfter+c.period {
			for _, a := range agents {
				if a.h.Valid(now) {
					capsAfter += a.h.Lease.Cap
				}
			}
		}
	}
	return gapAt, gapAgent, capsAfter
}

func mustApply(t *testing.T, s *State, c Command) Result {
	t.Helper()
	r, err := s.Apply(c)
	if err != nil {
		t.Fatalf("Apply(%+v) = %v", c, err)
	}
	if err := s.CheckInvariants(); err != nil {
		t.Fatalf("after %+v: %v", c, err)
	}
	return r
}

// TestHandOverKeepsALease: a region cut off from the global group spends
// its slice, then its safe share, and the hand-over between the two never
// leaves an agent without a valid lease while the safe share is above 0.
// Every agent renews at its renew point, as the agent does, and its answer
// comes a round trip later; what it spends under one period after the
// upstream funding ended is within the safe share.
func TestHandOverKeepsALease(t *testing.T) {
	cases := []struct {
		name string
		handOver
	}{
		// The two-region demo: lease.period 2s, safe share 10/s (burst 20),
		// the global budget (100, 50) less both safe shares split in two.
		{"demo", handOver{period: 2 * sec, own: Share2{20, 10}, fund: Share2{30, 15}, agents: 2, rtt: 5_000, renewAt: 0.5}},
		{"one agent, slow round trips", handOver{period: 10 * sec, own: Share2{1, 0.5}, fund: Share2{100, 50}, agents: 1, rtt: 200_000, renewAt: 0.5}},
		{"four agents, short period", handOver{period: sec / 2, own: Share2{5, 5}, fund: Share2{50, 50}, agents: 4, rtt: 10_000, renewAt: 0.5}},
		{"late renew point", handOver{period: 3 * sec, own: Share2{10, 10}, fund: Share2{10, 10}, agents: 3, rtt: 20_000, renewAt: 0.8}},
	}
	for _, tc := range cases {
		for _, left := range []int64{tc.period / 5, tc.period / 3, tc.period / 2, 3 * tc.period / 4, tc.period} {
			c := tc.handOver
			c.fundLeft = left
			t.Run(fmt.Sprintf("%s/funded for %dms", tc.name, left/1000), func(t *testing.T) {
				gapAt, who, caps := c.run(t)
				if gapAt >= 0 {
					t.Errorf("agent %s held no valid lease %dms into the cut (funding ends at %dms), with a safe share of %+v",
						who, (gapAt-1000*sec)/1000, left/1000, c.own)
				}
				if caps > c.own.Burst*(1+1e-9) {
					t.Errorf("one period after the funding ended, the agents' caps sum to %v, above the safe share's burst %v", caps, c.own.Burst)
				}
			})
		}
	}
}

// TestHandOverWithinOwnPart: whatever order holders are granted, renewed
// and confirm their answers in around a funding's end, the answers that
// reach past it (and that their holders may still spend under: the one
// each adopted last, whose sizes it confirms, and the answer to its
// latest command) sum to at most the own part, in cap and in rate.
func TestHandOverWithinOwnPart(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := New()
		const t0 = 1000 * sec
		period := rapid.Int64Range(sec/2, 4*sec).Draw(rt, "period")
		own := Share2{rapid.Float64Range(0.1, 50).Draw(rt, "own burst"), rapid.Float64Range(0, 50).Draw(rt, "own rate")}
		if own.Rate < MinRate {
			own.Rate = 0
		}
		notAfter := t0 + period
		cfg := ConfigureQuota{Now: t0, Quota: "g", Burst: own.Burst, Rate: own.Rate,
			LeasePeriod: period, SafetyMargin: rapid.Int64Range(0, period/2).Draw(rt, "margin"), Funded: true}
		apply := func(c Command) Result {
			r, err := s.Apply(c)
			if err != nil {
				rt.Fatalf("Apply(%+v) = %v", c, err)
			}
			if err := s.CheckInvariants(); err != nil {
				rt.Fatalf("after %+v: %v", c, err)
			}
			return r
		}
		apply(cfg)
		fb, fr := rapid.Float64Range(0, 500).Draw(rt, "fund burst"), rapid.Float64Range(0, 500).Draw(rt, "fund rate")
		if fr < MinRate {
			fr = 0
		}
		apply(Fund{Now: t0, Quota: "g", Burst: fb, Rate: fr, Deposit: fb, NotAfter: notAfter})
		// A holder may spend under the answer it adopted last, and, once it
		// arrives, the answer to the latest command it sent (Holding never
		// adopts an answer to an older one).
		type holder struct {
			seq               uint64
			id                uint64
			adopted, awaiting *Lease
		}
		holders := make([]holder, rapid.IntRange(1, 5).Draw(rt, "holders"))
		now := notAfter - period/2
		for range rapid.IntRange(1, 40).Draw(rt, "steps") {
			now += rapid.Int64Range(0, period/8).Draw(rt, "dt")
			i := rapid.IntRange(0, len(holders)-1).Draw(rt, "holder")
			h := &holders[i]
			name := fmt.Sprintf("h%d", i)
			h.seq++
			demand := rapid.Float64Range(0, 100).Draw(rt, "demand")
			if h.awaiting != nil && rapid.Bool().Draw(rt, "adopt") {
				h.adopted = h.awaiting
			}
			if h.id == 0 {
				h.awaiting = apply(Grant{Now: now, Holder: name, Seq: h.seq, Quota: "g", Demand: demand, Config: ptrTo(cfg.Config())}).Lease
			} else {
				it := RenewItem{LeaseID: h.id, Quota: "g", Demand: demand}
				if h.adopted != nil {
					it.ConfirmedCap, it.ConfirmedRate = h.adopted.Cap, h.adopted.Rate
				}
				h.awaiting = apply(Renew{Now: now, Holder: name, Seq: h.seq, Items: []RenewItem{it}}).Items[0].Lease
			}
			if h.awaiting == nil {
				h.id, h.adopted = 0, nil
				continue
			}
			h.id = h.awaiting.ID
			var sumCap, sumRate float64
			for _, h := range holders {
				var c, r float64
				for _, a := range []*Lease{h.adopted, h.awaiting} {
					if a != nil && a.Expiry > notAfter {
						c, r = max(c, a.Cap), max(r, a.Rate)
					}
				}
				sumCap, sumRate = sumCap+c, sumRate+r
			}
			if sumCap > own.Burst*(1+1e-9) || sumRate > own.Rate*(1+1e-9)+1e-12 {
				rt.Fatalf("answers reaching past the funding's end sum to (%v, %v), above the own part %+v", sumCap, sumRate, own)
			}
		}
	})
}
