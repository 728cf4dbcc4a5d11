package agent

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/region"
	"github.com/ration-dev/ration/internal/rules"
)

// Hot keys of mode auto rules, the agent's side (the store's side, and the
// argument that the hand-over keeps B + r*T, is internal/bucket/hot.go):
//
//   - A subject of an auto rule is decided in the store, by the hot-key
//     script, until the store answers that it is promoted ("leased", with
//     the promotion's epoch and how long its mark lasts), or that this very
//     decision promoted it.
//   - From then on the agent decides it on a lease of the promotion's quota,
//     rule|subject@epoch, but only while a mark it has seen is live:
//     counted like a lease term from when the agent SENT the call that
//     reported the mark, shortened for clock drift and pauses
//     (lease.AgentValidity). Past that, the subject goes back to the store,
//     which answers "leased" again (and so renews what the agent has seen)
//     or decides, if the mark has lapsed.
//   - Every markEvery, a loop extends the marks of every promoted subject it
//     spends on, in one pipelined round trip, reporting the decisions made
//     since the last one: the store's rate estimate then tells when the
//     subject has cooled (answer "cool": the agent stops extending it), or
//     that the promotion is over ("gone": the agent stops at once).
//
// Memory is bounded: at most maxHot promoted subjects per agent (a subject
// is hot only at PromoteAbove decisions/s, so a region has few); past it a
// promoted subject falls to its rule's failure policy until a slot frees.

// Clock-drift bound and longest pause between a validity check and the
// admission it allows, for marks: the holder's defaults (holder.Options),
// since a mark is spent alongside a lease under the same assumptions.
const (
	hotDrift = 0.001
	hotPause = 50 * time.Millisecond
	// markEvery is how often a hold is extended, as a fraction of it: a
	// quarter lets three rounds fail before a promoted subject goes back
	// to the store.
	markDivisor = 8
	maxHot      = 10_000
)

// marker is the store's side of hot keys (bucket.RedisStore and
// bucket.MemoryStore have it).
type marker interface {
	Mark(ctx context.Context, marks []bucket.MarkRequest, out []bucket.MarkOutcome)
}

// hotKey is one promoted subject this agent spends on.
type hotKey struct {
	rule    *rules.Rule
	limit   bucket.Limit
	key     string // the store's bucket key
	subject string // the lease subject: subject@epoch
	epoch   int64
	hold    int64 // µs
	demote  float64
	// until is when spending stops (leases' clock, µs): the latest mark
	// seen, counted from the send of the call that reported it.
	until atomic.Int64
	// cool: the store said the subject has cooled; no more extensions.
	cool atomic.Bool
	// count is the decisions made on the lease since the last mark.
	count atomic.Int64
}

// hotKeys is the agent's table of promoted subjects.
type hotKeys struct {
	region region.ID
	clock  func() int64 // the leases' clock (µs)
	mu     sync.RWMutex
	m      map[string]*hotKey
	params atomic.Pointer[hotParams]
	met    *metrics
}

// hotParams caches each auto rule's bucket.Hot for one rules set, so a
// decision allocates none.
type hotParams struct {
	set *rules.Set
	m   map[*rules.Rule]*bucket.Hot
}

func newHotKeys(id region.ID, clock func() int64, met *metrics) *hotKeys {
	return &hotKeys{region: id, clock: clock, m: map[string]*hotKey{}, met: met}
}

// hot returns rule's store parameters in this region.
func (h *hotKeys) hot(set *rules.Set, r *rules.Rule) *bucket.Hot {
	p := h.params.Load()
	if p == nil || p.set != set {
		np := &hotParams{set: set, m: map[*rules.Rule]*bucket.Hot{}}
		for _, rr := range set.Rules() {
			if rr.Mode != rules.ModeAuto {
				continue
			}
			promote, _ := rr.Auto.Thresholds(h.region)
			np.m[rr] = &bucket.Hot{PromoteAbove: promote, Hold: rr.Auto.Hold.Microseconds(), Tau: rules.HotTau.Microseconds()}
		}
		h.params.Store(np)
		p = np
	}
	return p.m[r]
}

// spendable returns the promoted subject for key when a live mark allows
// spending its lease at now.
func (h *hotKeys) spendable(key string, now int64) *hotKey {
	h.mu.RLock()
	k := h.m[key]
	h.mu.RUnlock()
	if k == nil || now >= k.until.Load() {
		return nil
	}
	return k
}

// adopt records a promotion the store reported for st: the mark lasts p.For
// after the store's clock read, which came after sentAt (leases' clock).
// It returns the subject to spend on, or nil when the table is full or the
// mark is already too short to use.
func (h *hotKeys) adopt(st *step, p bucket.Promotion, sentAt int64) *hotKey {
	until := sentAt + lease.AgentValidity(p.For, hotDrift, hotPause.Microseconds())
	if until <= sentAt {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	k := h.m[st.req.Key]
	if k != nil && k.epoch == p.Epoch {
		if until > k.until.Load() {
			k.until.Store(until)
		}
		return k
	}
	if k == nil && len(h.m) >= maxHot {
		h.met.hotFull.Inc()
		return nil
	}
	_, demote := st.rule.Auto.Thresholds(h.region)
	k = &hotKey{
		rule: st.rule, limit: st.req.Limit, key: st.req.Key,
		subject: rules.PromotedSubject(st.subject, p.Epoch), epoch: p.Epoch,
		hold: st.rule.Auto.Hold.Microseconds(), demote: demote,
	}
	k.until.Store(until)
	h.m[st.req.Key] = k
	h.met.hotPromotions.Inc()
	h.met.hotSubjects.Set(float64(len(h.m)))
	return k
}

// markRound extends every live, uncooled mark once, and forgets promoted
// subjects whose marks have run out.
func (h *hotKeys) markRound(ctx context.Context, mk marker, timeout time.Duration) {
	now := h.clock()
	var keys []*hotKey
	h.mu.Lock()
	for key, k := range h.m {
		if now >= k.until.Load() {
			delete(h.m, key)
			continue
		}
		if !k.cool.Load() {
			keys = append(keys, k)
		}
	}
	h.met.hotSubjects.Set(float64(len(h.m)))
	h.mu.Unlock()
	if len(keys) == 0 {
		return
	}
	reqs := make([]bucket.MarkRequest, len(keys))
	counts := make([]int64, len(keys))
	for i, k := range keys {
		counts[i] = k.count.Swap(0)
		reqs[i] = bucket.MarkRequest{Key: k.key, Limit: k.limit, Epoch: k.epoch, Count: float64(counts[i]),
			Hold: k.hold, Tau: rules.HotTau.Microseconds(), DemoteBelow: k.demote}
	}
	out := make([]bucket.MarkOutcome, len(reqs))
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sent := h.clock()
	mk.Mark(ctx, reqs, out)
	for i, k := range keys {
		o := out[i]
		if o.Err != nil {
			// The decisions still happened: report them next time.
			k.count.Add(counts[i])
			h.met.hotMarks.WithLabelValues("error").Inc()
			continue
		}
		h.met.hotMarks.WithLabelValues(o.Result.Verdict.String()).Inc()
		switch o.Result.Verdict {
		case bucket.MarkKept:
			until := sent + lease.AgentValidity(o.Result.For, hotDrift, hotPause.Microseconds())
			for {
				cur := k.until.Load()
				if until <= cur || k.until.CompareAndSwap(cur, until) {
					break
				}
			}
		case bucket.MarkCool:
			k.cool.Store(true)
		case bucket.MarkGone:
			k.until.Store(0)
		}
	}
}

// runMarks extends marks every hold/markDivisor of the shortest hold in
// force (at most 250ms) until ctx is done.
func (s *Service) runMarks(ctx context.Context, mk marker) {
	every := func() time.Duration {
		d := 250 * time.Millisecond
		for _, r := range s.rules.Current().Rules() {
			if r.Mode == rules.ModeAuto {
				d = min(d, r.Auto.Hold/markDivisor)
			}
		}
		return d
	}
	t := time.NewTimer(every())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.hot.markRound(ctx, mk, s.cfg.DecisionTimeout)
		t.Reset(every())
	}
}

// RunHotMarks extends the marks of the promoted subjects of mode auto rules
// until ctx is done (see hotKeys). It returns at once when the store has no
// hot keys or the agent no leases.
func (s *Service) RunHotMarks(ctx context.Context) {
	mk, ok := s.store.(marker)
	if !ok || s.hot == nil {
		return
	}
	s.runMarks(ctx, mk)
}
