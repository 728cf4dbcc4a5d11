package agent

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"pgregory.net/rapid"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/rules"
)

// TestHotHandOverProperty runs the hand-over between a mode auto subject's
// store bucket and its promotions' leases in a small simulated world, and
// holds every run to the rule's bound: admissions of the subject over any
// window [t0, t1] of real time, through the store and every lease of every
// promotion, at most B + r (t1 - t0).
//
// The parts are the real ones but for the transport: the store is the
// hot-key model (bucket.HotTake, bucket.HotMark, the arithmetic hot.lua
// repeats bit for bit), the coordinator the lease state machine
// (lease.State, with StartEmpty quotas, Ticks and leader changes), the
// agents this package's hotKeys (adopt, spendable, markRound) spending
// through lease.Holding. Agents' clocks run off real time by up to the
// drift the agent assumes, and admit up to its pause allowance after the
// check. Messages are delayed and lost; agents are cut off from the store
// or the coordinator for a while; demand flips hot and cold so promotions
// and demotions keep happening.
func TestHotHandOverProperty(t *testing.T) {
	var promotions, leased, runs int
	rapid.Check(t, func(rt *rapid.T) {
		w := newHotWorld(rt)
		steps := rapid.IntRange(200, 2500).Draw(rt, "steps")
		for range steps {
			w.step(rt)
		}
		c := admission.CertainOvershoot(w.spans, w.l.Burst, w.l.Rate)
		if c.Overshoot > 1e-6 {
			for _, e := range w.events {
				rt.Logf("%s", e)
			}
			rt.Fatalf("B %v r %v: admitted %.3f tokens over B + r(t1 - t0) in [%v, %v] (%d admissions, %d on leases, %d promotions)",
				w.l.Burst, w.l.Rate, c.Overshoot, c.From, c.To, len(w.spans), w.leased, w.promotions)
		}
		promotions += w.promotions
		leased += w.leased
		runs++
	})
	// The property means nothing if the runs never hand over.
	if promotions < runs || leased == 0 {
		t.Fatalf("%d runs saw %d promotions and %d lease admissions: the world does not exercise the hand-over", runs, promotions, leased)
	}
	t.Logf("%d runs: %d promotions, %d admissions on leases", runs, promotions, leased)
}

const hotT0 = int64(1_790_000_000_000_000) // µs: real time starts here

type hotWorld struct {
	t      int64 // real time, µs
	l      bucket.Limit
	h      bucket.Hot
	rule   *rules.Rule
	store  bucket.HotState
	exists bool
	coord  *lease.State
	cfg    lease.QuotaConfig
	agents []*hotAgent
	inbox  []hotMsg // to the coordinator, and replies, by arrival time
	hot    bool     // demand phase
	flipAt int64

	spans                []admission.Span
	events               []string
	promotions, leased   int
	maxDelay, nextTickAt int64
	rnd                  *rand.Rand

	// With failovers on, the store keeps its past states, and once per
	// run it fails over to a replica that lost every write of the last
	// lostFor (asynchronous replication), or loses the key (eviction):
	// a promotion's mark may be gone with it.
	failovers  bool
	history    []hotSnap
	failedAt   int64 // real µs of the failover, 0: none yet
	lostFor    int64
	lostMark   bool // the store lost a mark that was live at the failover
	storeWrite int  // writes so far, for the history's bound
}

// hotSnap is the store after one write, at real time at.
type hotSnap struct {
	at     int64
	store  bucket.HotState
	exists bool
}

type hotAgent struct {
	name      string
	rate      float64 // clock rate, within the assumed drift
	offset    int64
	keys      *hotKeys
	holds     map[int64]*lease.Holding // by epoch
	seq       uint64
	renewAt   map[int64]int64 // local time of the next renewal, by epoch
	markAt    int64           // real time of the next mark round
	cutStore  int64           // cut off from the store until (real µs)
	cutCoord  int64           // from the coordinator until
	pending   map[int64]bool  // a grant in flight, by epoch
	lastLocal int64
}

// localAt is the agent's clock at real time t.
func (a *hotAgent) localAt(t int64) int64 {
	return a.offset + int64(math.Floor(float64(t-hotT0)*a.rate))
}

// local is the agent's monotonic clock read at real time t.
func (a *hotAgent) local(t int64) int64 {
	v := a.localAt(t)
	if v < a.lastLocal {
		v = a.lastLocal
	}
	a.lastLocal = v
	return v
}

type hotMsg struct {
	at    int64
	agent *hotAgent
	cmd   lease.Command // to the coordinator
	epoch int64
	seq   uint64
	reply *lease.Lease // a grant's or renewal's answer, to the agent
}

func newHotWorld(rt *rapid.T) *hotWorld {
	burst := rapid.SampledFrom([]float64{5, 20, 100}).Draw(rt, "burst")
	rate := rapid.SampledFrom([]float64{10, 50, 200}).Draw(rt, "rate")
	hold := rapid.SampledFrom([]time.Duration{200 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second}).Draw(rt, "hold")
	period := rapid.SampledFrom([]time.Duration{time.Second, 3 * time.Second}).Draw(rt, "lease period")
	promote := rapid.SampledFrom([]float64{20, 60, 150}).Draw(rt, "promote_above")
	rule := &rules.Rule{Name: "q", Burst: burst, Rate: rate, Mode: rules.ModeAuto,
		Auto: rules.Auto{PromoteAbove: promote, DemoteBelow: promote / 4, Hold: hold}}
	w := &hotWorld{
		t: hotT0, l: bucket.Limit{Burst: burst, Rate: rate}, rule: rule,
		h:     bucket.Hot{PromoteAbove: promote, Hold: hold.Microseconds(), Tau: rules.HotTau.Microseconds()},
		coord: lease.New(),
		cfg: lease.QuotaConfig{Burst: burst, Rate: rate, LeasePeriod: period.Microseconds(),
			SafetyMargin: int64(time.Second / time.Microsecond), StartEmpty: true},
		maxDelay: rapid.Int64Range(0, 80_000).Draw(rt, "max delay µs"),
		rnd:      rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "seed"), 1)),
	}
	n := rapid.IntRange(1, 4).Draw(rt, "agents")
	for i := range n {
		a := &hotAgent{
			name:    string(rune('a' + i)),
			rate:    1 + rapid.Float64Range(-hotDrift/2, hotDrift/2).Draw(rt, "clock rate"),
			offset:  rapid.Int64Range(0, 1e12).Draw(rt, "clock offset"),
			holds:   map[int64]*lease.Holding{},
			renewAt: map[int64]int64{},
			pending: map[int64]bool{},
		}
		a.keys = newHotKeys("", func() int64 { return a.local(w.t) }, newMetrics(prometheus.NewRegistry()))
		w.agents = append(w.agents, a)
	}
	return w
}

func (w *hotWorld) delay() int64 { return w.between(0, w.maxDelay) }

// between draws from [lo, hi] with the world's generator: rapid chooses
// the world's shape and seed, and the world's many small choices come
// from the seed (rapid's own draws lean to the ends of their ranges, which
// would keep every agent cut off most of the time).
func (w *hotWorld) between(lo, hi int64) int64 { return lo + w.rnd.Int64N(hi-lo+1) }

func (w *hotWorld) step(rt *rapid.T) {
	w.t += w.between(100, 20_000)
	if w.t >= w.flipAt {
		w.hot = !w.hot
		w.flipAt = w.t + w.between(500_000, 4_000_000)
	}
	if w.t >= w.nextTickAt {
		w.apply(lease.Tick{Now: w.t})
		w.nextTickAt = w.t + 500_000
	}
	if int(w.between(int64(0), int64(400))) == 0 {
		w.apply(lease.LeaderElected{Now: w.t})
	}
	if w.failovers && w.failedAt == 0 && w.between(0, 600) == 0 {
		w.failover()
	}
	w.deliver()
	for _, a := range w.agents {
		switch int(w.between(int64(0), int64(300))) {
		case 0:
			a.cutStore = w.t + w.between(100_000, 3_000_000)
		case 1:
			a.cutCoord = w.t + w.between(100_000, 5_000_000)
		}
		if w.t >= a.markAt {
			w.markRound(a)
			a.markAt = w.t + w.h.Hold/markDivisor
		}
		w.renew(rt, a)
	}
	// Demand: while hot, several decisions per step (well above
	// promote_above across the agents); while cold, a few per second.
	n := 0
	if w.hot {
		n = int(w.between(int64(0), int64(4)))
	} else if int(w.between(int64(0), int64(20))) == 0 {
		n = 1
	}
	for range n {
		a := w.agents[w.rnd.IntN(len(w.agents))]
		w.decide(rt, a)
	}
}

// decide is one decision of the subject by a, as charge does it.
func (w *hotWorld) decide(rt *rapid.T, a *hotAgent) {
	st := &step{rule: w.rule, subject: "s", req: bucket.Request{Key: "k", Limit: w.l, Cost: 1, Hot: &w.h}}
	// The clock reading a lease decision is made with may be up to the
	// pause allowance old (read once per batch, then a GC pause): the
	// decision happens now, on a reading from up to hotPause ago.
	readAt := w.t - w.between(0, hotPause.Microseconds())
	stale := a.localAt(readAt)
	if k := a.keys.spendable(st.req.Key, stale); k != nil {
		w.spend(rt, a, k, stale, readAt)
		return
	}
	now := a.local(w.t)
	if w.t < a.cutStore {
		return // the store is unreachable: fail_closed
	}
	var d bucket.Result
	var leased bool
	var p bucket.Promotion
	w.store, d, leased, p = bucket.HotTake(w.store, w.exists, w.l, w.h, 1, w.t)
	w.exists = true
	w.wrote()
	if !leased && d.Allowed {
		w.admit(w.t, w.t)
	}
	if p.Epoch == 0 {
		return
	}
	w.events = append(w.events, fmt.Sprintf("%v: agent %s store leased=%v epoch %d for %dµs (store lu %d)", time.Duration(w.t-hotT0)*time.Microsecond, a.name, leased, p.Epoch, p.For, w.store.LeasedUntil-hotT0))
	if !leased {
		w.promotions++
	}
	k := a.keys.adopt(st, p, now)
	if leased && k != nil {
		w.spend(rt, a, k, a.local(w.t), w.t)
	}
}

// spend admits from k's lease, asking for one first if a holds none.
// now is the agent's clock reading the decision is made with, read at
// real time readAt (up to the pause allowance ago).
func (w *hotWorld) spend(rt *rapid.T, a *hotAgent, k *hotKey, now, readAt int64) {
	h := a.holds[k.epoch]
	if h == nil {
		h = &lease.Holding{Quota: rules.PromotedSubject("q|s", k.epoch),
			Validity: func(term int64) int64 { return lease.AgentValidity(term, hotDrift, hotPause.Microseconds()) }}
		a.holds[k.epoch] = h
	}
	if !h.Valid(now) {
		if !a.pending[k.epoch] {
			a.seq++
			g := h.Grant(now, a.name, a.seq, w.l.Rate)
			cfg := w.cfg
			g.Config = &cfg
			w.send(rt, a, g, k.epoch, a.seq)
			a.pending[k.epoch] = true
		}
		return
	}
	if !h.Spend(now, 1) {
		return
	}
	k.count.Add(1)
	// The charge is at now on the agent's clock: in real time somewhere
	// between the clock read and this moment.
	w.admit(readAt, w.t)
	w.leased++
}

// admit records an admission charged somewhere in [from, to] (real µs).
func (w *hotWorld) admit(from, to int64) {
	w.spans = append(w.spans, admission.Span{From: time.Duration(from-hotT0) * time.Microsecond, To: time.Duration(to-hotT0) * time.Microsecond, Cost: 1})
}

// renew renews a's live holdings at a third of their term.
func (w *hotWorld) renew(rt *rapid.T, a *hotAgent) {
	now := a.local(w.t)
	for epoch, h := range a.holds {
		if !h.Valid(now) || now < a.renewAt[epoch] || a.pending[epoch] {
			continue
		}
		a.seq++
		item := h.Renewal(now, a.seq, w.l.Rate, 0)
		w.send(rt, a, lease.Renew{Holder: a.name, Seq: a.seq, Items: []lease.RenewItem{item}}, epoch, a.seq)
		a.pending[epoch] = true
		a.renewAt[epoch] = now + h.Lease.Term/3
	}
}

func (w *hotWorld) send(rt *rapid.T, a *hotAgent, cmd lease.Command, epoch int64, seq uint64) {
	if w.t < a.cutCoord || int(w.between(int64(0), int64(20))) == 0 {
		a.pending[epoch] = false
		return
	}
	w.inbox = append(w.inbox, hotMsg{at: w.t + w.delay(), agent: a, cmd: cmd, epoch: epoch, seq: seq})
}

// deliver applies the commands and adopts the replies due by now.
func (w *hotWorld) deliver() {
	var later []hotMsg
	for _, m := range w.inbox {
		if m.at > w.t {
			later = append(later, m)
			continue
		}
		if m.cmd != nil {
			var res lease.Result
			var err error
			switch c := m.cmd.(type) {
			case lease.Grant:
				c.Now = w.t
				res, err = w.coord.Apply(c)
				if err == nil && res.Lease != nil {
					later = append(later, hotMsg{at: w.t + w.maxDelay/2, agent: m.agent, epoch: m.epoch, seq: m.seq, reply: res.Lease})
				}
			case lease.Renew:
				c.Now = w.t
				res, err = w.coord.Apply(c)
				if err == nil && len(res.Items) == 1 && res.Items[0].Err == nil && res.Items[0].Lease != nil {
					later = append(later, hotMsg{at: w.t + w.maxDelay/2, agent: m.agent, epoch: m.epoch, seq: m.seq, reply: res.Items[0].Lease})
				}
			}
			if err != nil {
				w.events = append(w.events, fmt.Sprintf("%v: %T refused: %v", time.Duration(w.t-hotT0)*time.Microsecond, m.cmd, err))
			}
			if err != nil || (res.Lease == nil && len(res.Items) == 0) {
				m.agent.pending[m.epoch] = false
			}
			continue
		}
		a := m.agent
		a.pending[m.epoch] = false
		if h := a.holds[m.epoch]; h != nil {
			ok := h.Adopt(a.local(w.t), m.seq, *m.reply)
			w.events = append(w.events, fmt.Sprintf("%v: agent %s adopt=%v %+v balance now %.3f", time.Duration(w.t-hotT0)*time.Microsecond, a.name, ok, *m.reply, h.Balance))
		}
	}
	w.inbox = later
}

func (w *hotWorld) apply(c lease.Command) {
	if _, err := w.coord.Apply(c); err != nil {
		panic(err)
	}
}

// markRound runs a's real mark loop against the model store, or against an
// unreachable one.
func (w *hotWorld) markRound(a *hotAgent) {
	a.keys.markRound(context.Background(), hotModelStore{w: w, cut: w.t < a.cutStore}, time.Second)
}

type hotModelStore struct {
	w   *hotWorld
	cut bool
}

func (s hotModelStore) Mark(_ context.Context, marks []bucket.MarkRequest, out []bucket.MarkOutcome) {
	for i, m := range marks {
		if s.cut {
			out[i] = bucket.MarkOutcome{Err: bucket.ErrUnavailable}
			continue
		}
		s.w.store, out[i].Result = bucket.HotMark(s.w.store, s.w.exists, m, s.w.t)
		s.w.wrote()
	}
}

// wrote records the store's state after a write, for a failover to go
// back to.
func (w *hotWorld) wrote() {
	if !w.failovers {
		return
	}
	w.history = append(w.history, hotSnap{at: w.t, store: w.store, exists: w.exists})
	// Only the last few seconds can be lost; older states are not needed.
	for len(w.history) > 1 && w.history[1].at < w.t-3_000_000 {
		w.history = w.history[1:]
	}
}

// failover replaces the store with a replica that has every write up to
// lostFor ago and none after (or, one time in four, with no key at all:
// an eviction, or a replica that never had it).
func (w *hotWorld) failover() {
	w.failedAt = w.t
	w.lostFor = w.between(0, 2_000_000)
	live := w.exists && w.store.LeasedUntil > w.t
	state, exists := bucket.HotState{}, false
	if w.between(0, 3) != 0 {
		for _, h := range w.history {
			if h.at > w.t-w.lostFor {
				break
			}
			state, exists = h.store, h.exists
		}
	}
	w.store, w.exists = state, exists
	w.lostMark = live && !(exists && state.LeasedUntil > w.t)
	w.history = nil
	w.events = append(w.events, fmt.Sprintf("%v: FAILOVER losing %v of writes (key kept %v, live mark lost %v)",
		time.Duration(w.t-hotT0)*time.Microsecond, time.Duration(w.lostFor)*time.Microsecond, exists, w.lostMark))
}

// TestHotHandOverFailoverProperty is TestHotHandOverProperty with one Redis
// failover per run that loses the latest writes (a replica that had not
// yet received them, any suffix of up to 2s, the promotion's mark and its
// extensions included), or the key itself. Such a failover can make the
// store and the leases admit at once: agents keep spending the lease of a
// promotion until the mark they were told of runs out (at most hold after
// the failover), while the store, which never saw that mark, decides from
// the older state it has. docs/failure-policies.md states the allowance:
// over any window, at most B + r * hold beyond B + r (t1 - t0), once per
// failover (the store's own history after the failover starts from at
// most B and refills at r; the old history's admissions after the
// failover are those of the old marks, which last at most hold).
func TestHotHandOverFailoverProperty(t *testing.T) {
	var lost, runs int
	var worst float64
	rapid.Check(t, func(rt *rapid.T) {
		w := newHotWorld(rt)
		w.failovers = true
		steps := rapid.IntRange(200, 2500).Draw(rt, "steps")
		for range steps {
			w.step(rt)
		}
		allowance := 1e-6
		if w.failedAt != 0 {
			allowance = w.l.Burst + w.l.Rate*float64(w.h.Hold)/1e6 + 1e-6
		}
		c := admission.CertainOvershoot(w.spans, w.l.Burst, w.l.Rate)
		if c.Overshoot > allowance {
			for _, e := range w.events {
				rt.Logf("%s", e)
			}
			rt.Fatalf("B %v r %v hold %v: admitted %.3f tokens over B + r(t1 - t0) in [%v, %v], allowance %.3f (%d admissions, %d on leases, %d promotions)",
				w.l.Burst, w.l.Rate, time.Duration(w.h.Hold)*time.Microsecond, c.Overshoot, c.From, c.To, allowance, len(w.spans), w.leased, w.promotions)
		}
		if w.lostMark {
			lost++
			worst = max(worst, c.Overshoot/(w.l.Burst+w.l.Rate*float64(w.h.Hold)/1e6))
		}
		runs++
	})
	// The allowance means nothing if no run lost a live mark. Under
	// -short (make check) rapid draws 20 runs, too few to require one.
	if lost == 0 && testing.Short() {
		t.Logf("-short: %d runs, none lost a live mark (make test requires one)", runs)
		return
	}
	if lost == 0 {
		t.Fatalf("%d runs, none lost a live mark in its failover: the world does not exercise it", runs)
	}
	t.Logf("%d runs, %d lost a live mark; the worst used %.0f%% of the allowance", runs, lost, 100*worst)
}
