package lease

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// The property test runs a small world: quotas, agents that hold leases
// through Holding and spend them on real (simulated) time, a network that
// loses, duplicates, delays and reorders commands and replies, and leaders
// whose clocks
// are offset from real time (within the safety margin, or far ahead after
// an election). After every step it checks:
//
//   - CheckInvariants (conservation at reserved sizes, pool within its room);
//   - ceilings only fall, except by ConfigureQuota;
//   - every lease an agent may still spend is counted by the coordinator at
//     least at the sizes the agent uses;
//   - a command already applied (duplicate, late, reordered) changes nothing
//     and credits nothing, and each credit is at most what was given back;
//   - the ledgers: per quota, tokens handed to holders (starting balances and
//     top-ups) plus the holders' possible refill (reserved rates over time)
//     minus credited returns <= B + r*(now - t0); per lease, credits <=
//     tokens handed to it plus its possible refill;
//   - with honest agents: the tokens they actually spent in any window of
//     real time [t0, t1] are <= B + r*(t1 - t0);
//   - copies of a lease (lease.default_share: an agent spends a copy of
//     its default lease per subject, each mirroring every command and
//     answer of the lease, and a renewal or release gives back only what
//     every copy gives back): with honest agents, each subject's spends
//     through every agent's copies in any window are <= B + r*(t1 - t0),
//     as for the lease itself;
//   - removal of idle quotas loses nothing: a shadow state that keeps every
//     quota (keepIdle) gets the same commands and must give the same
//     answers, hold the same quotas (but for the time of a full pool), and
//     hold every quota the state removed idle, exactly as a new one; grants
//     carry their quota's config, so a removed quota comes back at the next
//     grant, and only Tick removes;
//   - with max_subjects (the shadow is off then: it would count more
//     quotas), no creation takes the rule past it, and a refusal changes no
//     quota;
//
// and at the end, that replaying the command log on a fresh state, and
// through a snapshot (MarshalBinary/UnmarshalBinary) or a Clone taken
// midway, gives the same answers and byte-identical state.
func TestStateMachineProperties(t *testing.T) {
	var removed, copySpends, runs int
	rapid.Check(t, func(rt *rapid.T) {
		w := newWorld(rt)
		steps := rapid.IntRange(50, 800).Draw(rt, "steps")
		for range steps {
			w.step()
		}
		w.checkReplay()
		removed += w.removed
		copySpends += w.copySpends
		runs++
	})
	t.Logf("%d runs removed %d idle quotas and spent copies of leases %d times", runs, removed, copySpends)
}

type simAgent struct {
	name  string
	seq   uint64
	holds map[string]*Holding
	liar  bool // over-reports what it gives back, and keeps spending it
	// copies of holds[q] per subject, as an agent keeps them for a rule
	// with a default share (holder's shared.go).
	copies map[string]*copySet
}

// copySet is an agent's copies of one lease: tmpl mirrors it unspent (a
// subject untouched so far), subjects are spent; a subject's copy starts
// as a clone of tmpl.
type copySet struct {
	tmpl     *Holding
	subjects map[int]*Holding
}

// all is tmpl and every subject's copy.
func (c *copySet) all() []*Holding {
	out := []*Holding{c.tmpl}
	for _, h := range c.subjects {
		out = append(out, h)
	}
	return out
}

type flight struct {
	agent  *simAgent
	cmd    Command // as sent: Now is stamped when applied
	seq    uint64
	sentAt int64
}

type pendingReply struct {
	f   flight
	r   Result
	err error
}

type spent struct {
	at   int64 // real time
	cost float64
}

type ledger struct{ handed, credited, accrued float64 }

type world struct {
	t         *rapid.T
	s         *State
	log       []Command
	answers   []Result
	errs      []string
	real      int64 // real time, µs
	stampedAt int64 // real time of the last stamp
	offset    int64 // the leader's clock minus real time
	margin    int64 // every quota's safety margin
	maxTerm   int64
	quotas    []string
	cfgs      map[string]ConfigureQuota
	maxB      map[string]float64
	maxR      map[string]float64
	t0        map[string]int64
	agents    []*simAgent
	inflight  []flight
	replies   []pendingReply
	sent      []flight // applied at least once, for duplicates
	spends    map[string][]spent
	honest    bool
	byQuota   map[string]*ledger
	byLease   map[string]*ledger // holder + "|" + quota
	// maxSubjects is every quota's MaxSubjects (rule "r"); 0: no limit.
	maxSubjects int
	// shadow keeps idle quotas (nil with maxSubjects).
	shadow  *State
	removed int // quotas removed so far, for the coverage log
	// copySpends counts spends of copies, for the coverage log.
	copySpends int
	// shape is each quota's shape when last seen.
	shape map[string]QuotaConfig
}

func newWorld(t *rapid.T) *world {
	w := &world{
		t: t, s: New(), real: 1000 * sec,
		cfgs: map[string]ConfigureQuota{}, maxB: map[string]float64{}, maxR: map[string]float64{},
		t0: map[string]int64{}, spends: map[string][]spent{},
		byQuota: map[string]*ledger{}, byLease: map[string]*ledger{},
		shape: map[string]QuotaConfig{},
	}
	w.margin = rapid.Int64Range(sec/10, 2*sec).Draw(t, "margin")
	nq := rapid.IntRange(1, 3).Draw(t, "quotas")
	if nq > 1 && rapid.IntRange(0, 3).Draw(t, "max subjects?") == 0 {
		w.maxSubjects = rapid.IntRange(1, nq-1).Draw(t, "max subjects")
	} else {
		w.shadow = New()
		w.shadow.keepIdle = true
	}
	for i := range nq {
		name := fmt.Sprintf("q%d", i)
		w.quotas = append(w.quotas, name)
		w.byQuota[name] = &ledger{}
		w.configure(name)
	}
	w.honest = rapid.Bool().Draw(t, "honest")
	for i := range rapid.IntRange(2, 4).Draw(t, "agents") {
		w.agents = append(w.agents, &simAgent{
			name: fmt.Sprintf("a%d", i), holds: map[string]*Holding{}, liar: !w.honest && i == 0,
			copies: map[string]*copySet{},
		})
	}
	return w
}

// stamp is the leader's clock, sometimes read a little before the entry is
// applied. Entries are stamped in log order, so the real times at which they
// are stamped never go back (the Now they carry can, across leaders).
func (w *world) stamp() int64 { return w.stampAfter(0) }

// stampAfter stamps a command sent at sentAt: a leader cannot stamp what
// it has not received.
func (w *world) stampAfter(sentAt int64) int64 {
	at := w.real
	if rapid.Bool().Draw(w.t, "stale stamp") {
		at -= rapid.Int64Range(0, w.margin/4).Draw(w.t, "staleness")
	}
	at = max(at, w.stampedAt, sentAt)
	w.stampedAt = at
	return max(0, at+w.offset)
}

func (w *world) configure(name string) {
	t := w.t
	c := ConfigureQuota{
		Quota:        name,
		Burst:        rapid.Float64Range(1, 1000).Draw(t, "burst"),
		LeasePeriod:  rapid.Int64Range(sec, 20*sec).Draw(t, "period"),
		SafetyMargin: w.margin,
	}
	if w.maxSubjects > 0 {
		c.Rule, c.MaxSubjects = "r", w.maxSubjects
	}
	if rapid.IntRange(0, 4).Draw(t, "rate kind") > 0 {
		c.Rate = rapid.Float64Range(0.5, 100).Draw(t, "rate")
	}
	unit := max(c.Rate, 1)
	if rapid.Bool().Draw(t, "min slice") {
		c.MinSlice = rapid.Float64Range(0, unit/4).Draw(t, "min")
	}
	if rapid.Bool().Draw(t, "max slice") {
		c.MaxSlice = c.MinSlice + rapid.Float64Range(0.01, unit).Draw(t, "max")
	}
	c.Now = w.stamp()
	if _, ok := w.cfgs[name]; !ok {
		w.t0[name] = max(c.Now, w.s.Now())
	}
	w.cfgs[name] = c
	w.maxB[name] = max(w.maxB[name], c.Burst)
	w.maxR[name] = max(w.maxR[name], c.Rate)
	w.maxTerm = max(w.maxTerm, c.LeasePeriod)
	if _, err := w.apply(c); err != nil && !errors.Is(err, ErrTooManySubjects) {
		t.Fatalf("configure %+v: %v", c, err)
	}
}

func (w *world) step() {
	t := w.t
	switch rapid.SampledFrom([]string{
		"deliver", "spend all", "grant", "wait", "renew", "deliver", "spend", "deliver", "spend all",
		"grant", "renew", "wait", "tick", "duplicate", "release", "leader", "tick", "leader", "configure", "reply",
		"quiet", "spend copy", "spend copy",
	}).Draw(t, "action") {
	case "quiet":
		// Every agent releases everything, and time passes with ticks: the
		// quotas go idle and are removed, to be recreated by later grants.
		for _, a := range w.agents {
			for _, q := range w.quotas {
				if h := a.holds[q]; h != nil && h.Lease.ID != 0 {
					a.seq++
					w.inflight = append(w.inflight, flight{agent: a, cmd: w.release(a, q, h), seq: a.seq, sentAt: w.real})
				}
				delete(a.holds, q)
				delete(a.copies, q)
			}
		}
		for len(w.inflight) > 0 {
			f := w.inflight[0]
			w.inflight = w.inflight[1:]
			r, err := w.applyHolder(f)
			w.sent = append(w.sent, f)
			w.reply(f, r, err)
		}
		for range 3 {
			w.real += 2*w.maxTerm + w.margin
			w.apply(Tick{Now: w.stamp()})
		}
	case "wait":
		if rapid.IntRange(0, 4).Draw(t, "long wait") == 0 {
			w.real += rapid.Int64Range(0, 2*w.maxTerm).Draw(t, "wait")
		} else {
			w.real += rapid.Int64Range(0, w.maxTerm/5).Draw(t, "short wait")
		}
	case "grant":
		// Mostly an agent asks for a quota it cannot spend; sometimes it
		// asks again for one it holds (a renewal without returns).
		a := rapid.SampledFrom(w.agents).Draw(t, "agent")
		q := rapid.SampledFrom(w.quotas).Draw(t, "quota")
		h := a.holds[q]
		if h == nil {
			h = &Holding{Quota: q}
			a.holds[q] = h
		}
		if h.Valid(w.real) && rapid.IntRange(0, 3).Draw(t, "grant again") > 0 {
			return
		}
		a.seq++
		demand := w.demand()
		g := h.Grant(w.real, a.name, a.seq, demand)
		if a.copies[q] == nil {
			a.copies[q] = &copySet{tmpl: &Holding{Quota: q}, subjects: map[int]*Holding{}}
		}
		for _, c := range a.copies[q].all() {
			c.Grant(w.real, a.name, a.seq, demand)
		}
		// As the coordinator does: the grant carries the quota's shape,
		// and recreates the quota if it was removed.
		cfg := w.cfgs[q].Config()
		g.Config = &cfg
		w.inflight = append(w.inflight, flight{agent: a, cmd: g, seq: a.seq, sentAt: w.real})
	case "renew":
		a := rapid.SampledFrom(w.agents).Draw(t, "agent")
		var items []RenewItem
		a.seq++
		for _, q := range w.quotas {
			h := a.holds[q]
			if h == nil || !h.Valid(w.real) {
				continue
			}
			surrender := 0.0
			if rapid.Bool().Draw(t, "surrender") {
				surrender = rapid.Float64Range(0, h.Lease.Cap).Draw(t, "surrender amount")
			}
			demand := w.demand()
			it := h.Renewal(w.real, a.seq, demand, surrender)
			if cs := a.copies[q]; cs != nil {
				for _, c := range cs.all() {
					it.Unused = min(it.Unused, c.Renewal(w.real, a.seq, demand, surrender).Unused)
				}
			}
			if a.liar {
				it.Unused += rapid.Float64Range(0, 1000).Draw(t, "lie")
			}
			items = append(items, it)
		}
		if len(items) == 0 {
			a.seq--
			return
		}
		w.inflight = append(w.inflight, flight{agent: a, cmd: Renew{Holder: a.name, Seq: a.seq, Items: items}, seq: a.seq, sentAt: w.real})
	case "release":
		a := rapid.SampledFrom(w.agents).Draw(t, "agent")
		q := rapid.SampledFrom(w.quotas).Draw(t, "quota")
		h := a.holds[q]
		if h == nil || h.Lease.ID == 0 {
			return
		}
		a.seq++
		rel := w.release(a, q, h)
		if a.liar {
			rel.Unused += rapid.Float64Range(0, 1000).Draw(t, "lie")
		}
		delete(a.holds, q)
		delete(a.copies, q)
		w.inflight = append(w.inflight, flight{agent: a, cmd: rel, seq: a.seq, sentAt: w.real})
	case "deliver":
		if len(w.inflight) == 0 {
			return
		}
		i := rapid.IntRange(0, len(w.inflight)-1).Draw(t, "which")
		f := w.inflight[i]
		w.inflight = append(w.inflight[:i], w.inflight[i+1:]...)
		r, err := w.applyHolder(f)
		w.sent = append(w.sent, f)
		w.reply(f, r, err)
	case "reply":
		// A delayed reply arrives, possibly after later ones.
		if len(w.replies) == 0 {
			return
		}
		i := rapid.IntRange(0, len(w.replies)-1).Draw(t, "which reply")
		p := w.replies[i]
		w.replies = append(w.replies[:i], w.replies[i+1:]...)
		w.receive(p.f, p.r, p.err)
	case "duplicate":
		if len(w.sent) == 0 {
			return
		}
		f := rapid.SampledFrom(w.sent).Draw(t, "duplicate of")
		last, known := w.s.LastSeq(f.agent.name)
		before, _ := w.s.MarshalBinary()
		r, err := w.applyHolder(f)
		if known && f.seq <= last {
			if !r.Replayed && !errors.Is(err, ErrStale) {
				t.Fatalf("duplicate of seq %d (last %d) applied again: %+v, %v", f.seq, last, r, err)
			}
			if after, _ := w.s.MarshalBinary(); !bytes.Equal(before, after) {
				t.Fatalf("duplicate of seq %d changed the state", f.seq)
			}
		}
		w.reply(f, r, err)
	case "spend":
		a := rapid.SampledFrom(w.agents).Draw(t, "agent")
		var valid []string
		for _, q := range w.quotas {
			if h := a.holds[q]; h != nil && h.Valid(w.real) {
				valid = append(valid, q)
			}
		}
		if len(valid) == 0 {
			return
		}
		q := rapid.SampledFrom(valid).Draw(t, "quota")
		h := a.holds[q]
		h.refill(w.real)
		cost := h.Balance
		if rapid.Bool().Draw(t, "spend part") {
			cost *= rapid.Float64Range(0, 1).Draw(t, "part")
		}
		if cost > 0 && h.Spend(w.real, cost) {
			w.recordSpend(q, cost)
		}
	case "spend all":
		// Every agent spends everything it can: the worst case for the
		// bound on spending.
		for _, a := range w.agents {
			for _, q := range w.quotas {
				if h := a.holds[q]; h != nil && h.Valid(w.real) {
					h.refill(w.real)
					if cost := h.Balance; cost > 0 && h.Spend(w.real, cost) {
						w.recordSpend(q, cost)
					}
				}
				if cs := a.copies[q]; cs != nil {
					for j := range 3 {
						c := cs.subjects[j]
						if c == nil {
							clone := *cs.tmpl
							c = &clone
							cs.subjects[j] = c
						}
						if cost := c.Available(w.real); cost > 0 && c.Spend(w.real, cost) {
							w.recordSpend(subjectKey(q, j), cost)
							w.copySpends++
						}
					}
				}
			}
		}
	case "spend copy":
		// A subject spends its copy of an agent's lease; a subject the
		// agent has not seen yet gets a clone of the untouched copy.
		a := rapid.SampledFrom(w.agents).Draw(t, "agent")
		q := rapid.SampledFrom(w.quotas).Draw(t, "quota")
		cs := a.copies[q]
		if cs == nil {
			return
		}
		j := rapid.IntRange(0, 2).Draw(t, "subject")
		c := cs.subjects[j]
		if c == nil || rapid.IntRange(0, 5).Draw(t, "forget subject") == 0 && c.Available(w.real) >= c.Lease.Cap && c.Owed >= cs.tmpl.Owed {
			// New, or forgotten once it is what a clone would be: full
			// again and owing what the lease owes (the holder's
			// evictable).
			clone := *cs.tmpl
			c = &clone
			cs.subjects[j] = c
		}
		cost := c.Available(w.real)
		if rapid.Bool().Draw(t, "spend part of copy") {
			cost *= rapid.Float64Range(0, 1).Draw(t, "copy part")
		}
		if cost > 0 && c.Spend(w.real, cost) {
			w.recordSpend(subjectKey(q, j), cost)
			w.copySpends++
		}
	case "tick":
		w.apply(Tick{Now: w.stamp()})
	case "leader":
		switch rapid.IntRange(0, 3).Draw(t, "clock") {
		case 0:
			// A leader whose clock is far ahead: only the election rule
			// keeps the old leases and the pools safe.
			w.offset = rapid.Int64Range(w.maxTerm, 3*w.maxTerm).Draw(t, "far ahead")
		case 1:
			w.offset = rapid.Int64Range(-3*w.maxTerm, 0).Draw(t, "far behind")
		default:
			w.offset = rapid.Int64Range(-w.margin/4, w.margin/4).Draw(t, "offset")
		}
		w.apply(LeaderElected{Now: w.stamp()})
		if rapid.Bool().Draw(t, "tick at once") {
			w.apply(Tick{Now: w.stamp()})
		}
	case "configure":
		w.configure(rapid.SampledFrom(w.quotas).Draw(t, "quota"))
	}
}

func (w *world) demand() float64 {
	return rapid.SampledFrom([]float64{50, 5, 500, 0.5, 0}).Draw(w.t, "demand")
}

// applyHolder stamps and applies a holder's command.
func (w *world) applyHolder(f flight) (Result, error) {
	switch c := f.cmd.(type) {
	case Grant:
		c.Now = w.stampAfter(f.sentAt)
		return w.apply(c)
	case Renew:
		c.Now = w.stampAfter(f.sentAt)
		return w.apply(c)
	case Release:
		c.Now = w.stampAfter(f.sentAt)
		return w.apply(c)
	}
	w.t.Fatalf("not a holder command: %+v", f.cmd)
	return Result{}, nil
}

// reply sends an answer back: lost, delivered at once, or delayed.
func (w *world) reply(f flight, r Result, err error) {
	switch rapid.IntRange(0, 3).Draw(w.t, "reply") {
	case 0: // lost
	case 1:
		w.replies = append(w.replies, pendingReply{f, r, err})
	default:
		w.receive(f, r, err)
	}
}

// receive is the agent getting an answer.
func (w *world) receive(f flight, r Result, err error) {
	a := f.agent
	// hs is an agent's holding of q and every copy of it.
	hs := func(q string) []*Holding {
		h := a.holds[q]
		if h == nil {
			return nil
		}
		out := []*Holding{h}
		if cs := a.copies[q]; cs != nil {
			out = append(out, cs.all()...)
		}
		return out
	}
	switch c := f.cmd.(type) {
	case Grant:
		if err == nil {
			for _, h := range hs(c.Quota) {
				h.Adopt(w.real, f.seq, *r.Lease)
			}
		}
	case Renew:
		for _, it := range r.Items {
			for _, h := range hs(it.Quota) {
				switch {
				case errors.Is(it.Err, ErrLeaseExpired):
					if h.Lease.ID == it.LeaseID {
						h.Drop()
					}
				case it.Err == nil:
					h.Adopt(w.real, f.seq, *it.Lease)
				}
			}
		}
	}
}

// release releases a's lease h of q and every copy of it, giving back
// only what every copy gives back.
func (w *world) release(a *simAgent, q string, h *Holding) Release {
	rel := h.Release(w.real, a.name, a.seq)
	if cs := a.copies[q]; cs != nil {
		for _, c := range cs.all() {
			rel.Unused = min(rel.Unused, c.Release(w.real, a.name, a.seq).Unused)
		}
	}
	return rel
}

// subjectKey names the spends of subject j through copies of q's leases.
func subjectKey(q string, j int) string { return fmt.Sprintf("%s#%d", q, j) }

// apply applies a command and checks every per-step property.
func (w *world) apply(c Command) (Result, error) {
	t := w.t
	prevNow := w.s.Now()
	ceil := map[string]QuotaInfo{}
	rates := map[string]float64{}
	for _, q := range w.quotas {
		ceil[q], _ = w.s.Quota(q)
		for _, l := range w.s.Leases(q) {
			rates[l.Holder+"|"+q] = l.ReservedRate
		}
	}
	var releasedQuota string
	if rel, ok := c.(Release); ok {
		if l, ok := w.s.LeaseByID(rel.LeaseID); ok {
			releasedQuota = l.Quota
		}
	}

	existed, idle := map[string]bool{}, map[string]bool{}
	for _, q := range w.quotas {
		_, existed[q] = w.s.Quota(q)
		qq := w.s.quotas[q]
		idle[q] = qq == nil || qq.idleAt(max(w.s.Now(), nowOf(c)))
	}
	subjectsBefore := w.s.Subjects("r")

	r, err := w.s.Apply(c)
	w.log = append(w.log, c)
	w.answers = append(w.answers, r)
	w.errs = append(w.errs, errString(err))
	if err != nil && !errors.Is(err, ErrStale) && !errors.Is(err, ErrLeaseExpired) && !errors.Is(err, ErrTooManySubjects) {
		t.Fatalf("Apply(%+v) = %v", c, err)
	}
	if err := w.s.CheckInvariants(); err != nil {
		t.Fatalf("after %+v: %v", c, err)
	}
	w.checkSubjects(c, r, err, existed, subjectsBefore)
	w.checkShadow(c, r, err)

	// Ledgers: reserved rates held since the previous step accrue.
	dt := float64(w.s.Now()-prevNow) / 1e6
	for key, rate := range rates {
		w.lease(key).accrued += rate * dt
		w.byQuota[quotaOf(key)].accrued += rate * dt
	}
	fresh := map[string]bool{}
	for _, q := range w.quotas {
		info, ok := w.s.Quota(q)
		fresh[q] = ok && idle[q] && info.QuotaConfig != w.shape[q]
		if fresh[q] {
			// An idle quota given a new shape starts afresh, as a new
			// quota: full at the new B whether or not Tick had removed
			// it. It owed nothing (full, no lease, no agent may spend), so
			// the bounds start again from here at the new shape.
			w.t0[q] = w.s.Now()
			w.byQuota[q] = &ledger{}
			w.spends[q] = nil
			for j := range 3 {
				w.spends[subjectKey(q, j)] = nil
			}
			w.maxB[q], w.maxR[q] = info.Burst, info.Rate
		}
		if ok {
			w.shape[q] = info.QuotaConfig
		}
	}
	if !r.Replayed {
		w.account(c, r, releasedQuota)
	}
	for _, q := range w.quotas {
		info, _ := w.s.Quota(q)
		if _, ok := c.(ConfigureQuota); !ok && existed[q] && !fresh[q] {
			tol := tolerance(info.CeilBurst, info.Leases)
			if info.CeilBurst > ceil[q].CeilBurst+tol || info.CeilRate > ceil[q].CeilRate+tol {
				t.Fatalf("%+v raised %s's ceilings from (%v, %v) to (%v, %v)", c, q,
					ceil[q].CeilBurst, ceil[q].CeilRate, info.CeilBurst, info.CeilRate)
			}
		}
		l := w.byQuota[q]
		// A stale stamp can read before t0: the bound there is B.
		limit := w.maxB[q] + w.maxR[q]*float64(max(0, w.s.Now()-w.t0[q]))/1e6
		if got := l.handed + l.accrued - l.credited; got > limit+1e-6*max(1, limit) {
			t.Fatalf("quota %s ledger: handed %v + refill bound %v - credited %v = %v > B + r*T = %v",
				q, l.handed, l.accrued, l.credited, got, limit)
		}
	}
	present := map[string]bool{}
	for _, q := range w.quotas {
		for _, l := range w.s.Leases(q) {
			present[l.Holder+"|"+q] = true
		}
	}
	for key, l := range w.byLease {
		if l.credited > l.handed+l.accrued+1e-6*max(1, l.handed+l.accrued) {
			t.Fatalf("lease %s credited %v > handed %v + refill bound %v", key, l.credited, l.handed, l.accrued)
		}
		if !present[key] {
			delete(w.byLease, key) // released or reclaimed: a new record starts afresh
		}
	}
	w.checkHolders()
	return r, err
}

func quotaOf(key string) string {
	for i := len(key) - 1; i >= 0; i-- {
		if key[i] == '|' {
			return key[i+1:]
		}
	}
	return key
}

func (w *world) lease(key string) *ledger {
	l := w.byLease[key]
	if l == nil {
		l = &ledger{}
		w.byLease[key] = l
	}
	return l
}

// account books a fresh answer's transfers, and checks no credit exceeds
// what was given back.
func (w *world) account(c Command, r Result, releasedQuota string) {
	t := w.t
	switch c := c.(type) {
	case Grant:
		if r.Lease != nil {
			w.byQuota[c.Quota].handed += r.Lease.Balance
			w.lease(c.Holder + "|" + c.Quota).handed += r.Lease.Balance
		}
	case Renew:
		for i, it := range r.Items {
			if it.Credited > c.Items[i].Unused {
				t.Fatalf("item %d credited %v, more than the %v given back", i, it.Credited, c.Items[i].Unused)
			}
			if it.Lease == nil {
				continue
			}
			key := c.Holder + "|" + it.Quota
			w.byQuota[it.Quota].handed += it.Lease.Balance
			w.byQuota[it.Quota].credited += it.Credited
			w.lease(key).handed += it.Lease.Balance
			w.lease(key).credited += it.Credited
		}
	case Release:
		if r.Credited > c.Unused {
			t.Fatalf("release credited %v, more than the %v given back", r.Credited, c.Unused)
		}
		if releasedQuota != "" {
			w.byQuota[releasedQuota].credited += r.Credited
			w.lease(c.Holder + "|" + releasedQuota).credited += r.Credited
		}
	}
}

// checkHolders: whatever an agent may still spend, the coordinator counts.
func (w *world) checkHolders() {
	for _, a := range w.agents {
		for q, h := range a.holds {
			if !h.Valid(w.real) {
				continue
			}
			var rec *LeaseInfo
			for _, l := range w.s.Leases(q) {
				if l.Holder == a.name {
					rec = &l
				}
			}
			eps := 1e-9 * max(1, w.cfgs[q].Burst)
			switch {
			case rec == nil:
				w.t.Fatalf("agent %s may spend lease %d of %s until %d (now %d), but the coordinator has no lease for it",
					a.name, h.Lease.ID, q, h.ValidUntil, w.real)
			case rec.ReservedCap < h.Lease.Cap-eps || rec.ReservedRate < h.Lease.Rate-eps:
				w.t.Fatalf("agent %s spends %s at cap %v rate %v, coordinator reserves only %v, %v",
					a.name, q, h.Lease.Cap, h.Lease.Rate, rec.ReservedCap, rec.ReservedRate)
			case h.Balance > h.Lease.Cap+eps:
				w.t.Fatalf("agent %s holds %v above its cap %v", a.name, h.Balance, h.Lease.Cap)
			}
		}
	}
}

// recordSpend checks every window of real time ending now: with honest
// agents, what was spent in [t0, now] is at most B + r*(now - t0).
func (w *world) recordSpend(key string, cost float64) {
	w.spends[key] = append(w.spends[key], spent{at: w.real, cost: cost})
	if !w.honest {
		return
	}
	q, _, _ := strings.Cut(key, "#") // a subject's spends have its quota's bound
	s := w.spends[key]
	var sum float64
	for k := len(s) - 1; k >= 0; k-- {
		sum += s[k].cost
		limit := w.maxB[q] + w.maxR[q]*float64(w.real-s[k].at)/1e6
		if sum > limit+1e-9*max(1, limit) {
			w.t.Fatalf("quota %s: %v spent in [%d, %d], more than B + r*T = %v", key, sum, s[k].at, w.real, limit)
		}
	}
}

// checkSubjects: only Tick removes a quota; a quota is created only within
// max_subjects; a refused creation creates nothing.
func (w *world) checkSubjects(c Command, r Result, err error, existed map[string]bool, before int) {
	t := w.t
	for _, q := range w.quotas {
		_, now := w.s.Quota(q)
		switch {
		case existed[q] && !now:
			if _, ok := c.(Tick); !ok {
				t.Fatalf("%+v removed quota %s: only Tick removes", c, q)
			}
			w.removed++
		case !existed[q] && now && w.maxSubjects > 0 && w.s.Subjects("r") > w.maxSubjects:
			t.Fatalf("%+v created %s: rule r has %d quotas, max_subjects %d", c, q, w.s.Subjects("r"), w.maxSubjects)
		}
	}
	if errors.Is(err, ErrTooManySubjects) && !r.Replayed {
		if before < w.maxSubjects {
			t.Fatalf("%+v refused with %d of %d subjects", c, before, w.maxSubjects)
		}
		if w.s.Subjects("r") != before {
			t.Fatalf("refused %+v changed the quotas of rule r from %d to %d", c, before, w.s.Subjects("r"))
		}
	}
}

// checkShadow applies c to the shadow, which keeps idle quotas: answers
// must be the same, quotas in both the same (but for when a full pool was
// last refilled), and a quota only the shadow holds exactly what a new
// quota of its shape is.
func (w *world) checkShadow(c Command, r Result, err error) {
	if w.shadow == nil {
		return
	}
	t := w.t
	sr, serr := w.shadow.Apply(c)
	if errString(serr) != errString(err) || !sameResult(sr, r) {
		t.Fatalf("%+v: answered %+v, %v; the shadow that keeps idle quotas answered %+v, %v", c, r, err, sr, serr)
	}
	for _, q := range w.quotas {
		got, ok := w.s.Quota(q)
		want, sok := w.shadow.Quota(q)
		switch {
		case ok && !sok:
			t.Fatalf("quota %s exists, but not in the shadow", q)
		case ok:
			got.PoolAt, want.PoolAt = 0, 0
			if got != want {
				t.Fatalf("after %+v, quota %s is %+v; in the shadow %+v", c, q, got, want)
			}
			gl, sl := w.s.Leases(q), w.shadow.Leases(q)
			if len(gl) != len(sl) {
				t.Fatalf("quota %s has %d leases; %d in the shadow", q, len(gl), len(sl))
			}
			for i := range gl {
				if gl[i] != sl[i] {
					t.Fatalf("quota %s lease %d is %+v; in the shadow %+v", q, i, gl[i], sl[i])
				}
			}
		case sok:
			// Removed: the shadow's must be a new quota of its shape.
			if want.Leases != 0 || want.Fund != (Funding{}) || want.Pool != want.Burst ||
				want.CeilBurst != want.Burst || want.CeilRate != want.Rate {
				t.Fatalf("after %+v, quota %s is gone, but the shadow's is not idle: %+v", c, q, want)
			}
		}
	}
}

// nowOf is the time a command carries.
func nowOf(c Command) int64 {
	switch c := c.(type) {
	case ConfigureQuota:
		return c.Now
	case Grant:
		return c.Now
	case Renew:
		return c.Now
	case Release:
		return c.Now
	case Tick:
		return c.Now
	case LeaderElected:
		return c.Now
	}
	return 0
}

// checkReplay: the log replayed on a fresh state, and through a snapshot and
// a clone taken midway, gives the same answers and the same bytes.
func (w *world) checkReplay() {
	t := w.t
	want, err := w.s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	k := rapid.IntRange(0, len(w.log)).Draw(t, "snapshot at")
	fresh := New()
	w.replay(fresh, 0, k, "fresh")
	b, err := fresh.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	restored := New()
	if err := restored.UnmarshalBinary(b); err != nil {
		t.Fatalf("UnmarshalBinary of a snapshot at %d: %v", k, err)
	}
	clone := fresh.Clone()
	for name, s := range map[string]*State{"fresh": fresh, "snapshot": restored, "clone": clone} {
		w.replay(s, k, len(w.log), name)
		got, _ := s.MarshalBinary()
		if !bytes.Equal(got, want) {
			t.Fatalf("%s replay (split at %d of %d) differs:\n got %s\nwant %s", name, k, len(w.log), got, want)
		}
	}
}

func (w *world) replay(s *State, from, to int, name string) {
	for i := from; i < to; i++ {
		r, err := s.Apply(w.log[i])
		if errString(err) != w.errs[i] || !sameResult(r, w.answers[i]) {
			w.t.Fatalf("%s replay of command %d %+v: %+v, %v; first time %+v, %s", name, i, w.log[i], r, err, w.answers[i], w.errs[i])
		}
	}
}
