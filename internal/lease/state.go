package lease

import (
	"fmt"
	"slices"
)

// RecordTTL is how long, in microseconds, a holder's last answer is kept
// after the holder has no lease left (while it has one, it is always kept).
// A duplicate delayed longer than that is applied as new: the worst it can
// do is grant a lease nobody spends, which holds its share (and loses its
// starting balance) until it is reclaimed. It can never credit twice, since
// credits need a live lease of the holder, and it has none.
const RecordTTL = int64(15 * 60 * 1e6)

// State is the replicated lease state of every quota: a pure, deterministic
// function of the commands applied to it (see doc.go). It is not safe for
// concurrent use; the FSM serialises Apply, and reads happen on a Clone.
type State struct {
	now     int64
	nextID  uint64
	quotas  map[string]*quota
	leases  map[uint64]*lease
	holders map[string]*holder
	tunings map[string]Tuning // by Tuning.Key
	// upSeq is the largest upstream sequence number a Fund has applied
	// (Fund.Seq); it survives the removal of the quota it funded.
	upSeq uint64
	// subjects counts the quotas of each QuotaConfig.Rule, for MaxSubjects;
	// derived, rebuilt from the quotas.
	subjects map[string]int
	// peak is the largest size each map has had since it was last rebuilt
	// (see compact); not state.
	peak struct{ quotas, leases, holders int }
	// keepIdle disables the removal of idle quotas: the property test's
	// model, which removal must not be distinguishable from. Tests only.
	keepIdle bool
}

// quota is one quota's pool and leases.
type quota struct {
	name string
	// cfg is the effective shape: base, plus fund for a funded quota.
	cfg QuotaConfig
	// base is the shape ConfigureQuota set; fund what the latest Fund adds
	// (zero unless base.Funded).
	base   QuotaConfig
	fund   Funding
	pool   float64 // P, as of poolAt
	poolAt int64
	// ceilBurst and ceilRate are the limits conservation is currently held
	// to: the configured B and r, or more while a configuration change has
	// left more reserved than they allow. Only ConfigureQuota raises them;
	// every other step can only lower them, back to B and r.
	ceilBurst float64
	ceilRate  float64
	leases    []*lease // in creation order, which every replica shares
	byHolder  map[string]*lease
	// Derived aggregates (agg.go): the reserved sums and the fair share.
	res, live, evB, evC *node
	resSum              [3]float64 // sums(res), at hand for Tick
}

// lease is the coordinator's record of one holder's lease on one quota.
// Fields are exported for the snapshot encoding only.
type lease struct {
	ID     uint64 `json:"id"`
	Holder string `json:"holder"`
	Quota  string `json:"quota"`
	// Cap and Rate are the sizes of the latest answer.
	Cap  float64 `json:"cap"`
	Rate float64 `json:"rate"`
	// ResCap and ResRate are the sizes counted against the quota: the
	// largest the holder may still be spending under (>= Cap, Rate). They
	// fall back to Cap and Rate when the holder confirms the latest answer,
	// or once ResUntil has passed (every older answer's term is over).
	ResCap   float64 `json:"res_cap"`
	ResRate  float64 `json:"res_rate"`
	ResUntil int64   `json:"res_until"`
	// Term is the longest term any answer of this lease was given, for the
	// new-leader rule.
	Term      int64 `json:"term"`
	Expiry    int64 `json:"expiry"`
	ReclaimAt int64 `json:"reclaim_at"`
	// Bound is an upper bound of the tokens the holder can have unspent,
	// as of BoundAt: what it was given plus what it could have refilled,
	// minus what it gave back. Credits never exceed it.
	Bound   float64 `json:"bound"`
	BoundAt int64   `json:"bound_at"`
	Demand  float64 `json:"demand"`
	Weight  float64 `json:"weight"`
	// Bounds, when set, replace the quota's period and slice bounds.
	Bounds *Bounds `json:"bounds,omitempty"`

	pos int // index in its quota's leases, set by targets; not state
	// Derived (agg.go): the lease's entries in its quota's aggregates,
	// whether it is in the fair share, and its terms there.
	nodes  [nNodes]*node
	inFill bool
	lim    limits
}

// holder is what is remembered about a holder for idempotence.
type holder struct {
	seq    uint64 // last applied sequence number
	at     int64  // when it was applied
	answer answer // its answer, replayed to a retry of seq
	leases int    // live leases; derived, rebuilt from the leases
}

// New returns an empty state.
func New() *State {
	return &State{
		nextID:   1,
		quotas:   map[string]*quota{},
		leases:   map[uint64]*lease{},
		holders:  map[string]*holder{},
		tunings:  map[string]Tuning{},
		subjects: map[string]int{},
	}
}

// Now is the state's clock: the largest Now of any command applied.
func (s *State) Now() int64 { return s.now }

// Lease is an answer to a grant or a renewal: the terms the holder spends
// under once it has adopted them.
type Lease struct {
	ID     uint64 `json:"id"`
	Quota  string `json:"quota"`
	Holder string `json:"holder"`
	// Balance is the number of tokens this answer moved from the pool into
	// the holder's bucket: the starting balance of a new lease, the top-up
	// of a renewal. The holder adds it, then caps its bucket at Cap.
	Balance float64 `json:"balance"`
	// Cap is b_i, the holder's bucket capacity; Rate is r_i, its refill in
	// tokens per second.
	Cap  float64 `json:"cap"`
	Rate float64 `json:"rate"`
	// Expiry is Now + Term on the coordinator's clock. The holder does not
	// use it: it stops spending Term (less drift and pause) after it SENT
	// the request, on its own monotonic clock.
	Expiry int64 `json:"expiry"`
	Term   int64 `json:"term"`
}

// ItemResult answers one RenewItem.
type ItemResult struct {
	LeaseID uint64
	Quota   string
	// Lease holds the new terms; nil when Err is set.
	Lease *Lease
	// Credited is the part of the item's Unused that went back into the
	// pool (see doc.go for why it can be less).
	Credited float64
	// Err is nil, or wraps ErrLeaseExpired (a quota that does not exist has
	// no live lease). Answers recorded by older versions may wrap
	// ErrUnknownQuota instead.
	Err error
}

// Result is the answer to a command. Which fields are set depends on it:
// Grant sets Lease, Renew sets Items (one per item, in order), Release sets
// Credited, Tick sets Reclaimed; the others set nothing.
type Result struct {
	Lease     *Lease
	Items     []ItemResult
	Credited  float64
	Reclaimed []uint64 // lease IDs, ascending
	// Replayed marks the recorded answer to a command that was already
	// applied (a retry with the same Seq): nothing was applied this time.
	Replayed bool
}

// Apply applies one command and answers it. It is a deterministic function
// of the state and the command: it reads no clock, no randomness and no map
// order that could reach the state or the answer.
//
// A command that fails validation (ErrInvalid), names an unknown quota
// (ErrUnknownQuota, except a renew item), or is stale (ErrStale), changes
// nothing. Any other answer, error or not, is recorded against the holder's
// Seq, so a retry gets it again with Replayed set.
func (s *State) Apply(cmd Command) (Result, error) {
	switch c := value(cmd).(type) {
	case ConfigureQuota:
		return Result{}, s.configure(c)
	case Grant:
		return s.grant(c)
	case Renew:
		return s.renew(c)
	case Release:
		return s.release(c)
	case Tick:
		return s.tick(c)
	case LeaderElected:
		return Result{}, s.leaderElected(c)
	case Fund:
		return Result{}, s.fundQuota(c)
	case Tune:
		if err := c.validate(); err != nil {
			return Result{}, err
		}
		return Result{}, s.tune(c)
	}
	return Result{}, fmt.Errorf("lease: apply %T: %w", cmd, ErrUnknownCommand)
}

// advance makes the state's clock monotonic: a leader whose clock is behind
// its predecessor's cannot move time backwards.
func (s *State) advance(now int64) {
	if now > s.now {
		s.now = now
	}
}

func (s *State) configure(c ConfigureQuota) error {
	if err := c.validate(); err != nil {
		return err
	}
	q := s.quotas[c.Quota]
	if q == nil || q.base != c.Config() && q.idleAt(max(s.now, c.Now)) {
		// New, or idle: an idle quota is a new one of its old shape, which
		// Tick may or may not have removed yet (see renewed).
		if err := s.admits(c.Quota, c.Config(), q); err != nil {
			return fmt.Errorf("lease: configure %q: %w", c.Quota, err)
		}
		s.advance(c.Now)
		s.renewed(q, c.Quota, c.Config())
		return nil
	}
	s.advance(c.Now)
	q.refill(s.now) // up to now under the old shape
	s.count(q.base.Rule, -1)
	q.base = c.Config()
	s.count(q.base.Rule, 1)
	if !q.base.Funded {
		q.fund = Funding{}
	}
	q.reshape()
	q.refit() // the slice bounds may have changed
	return nil
}

func (s *State) fundQuota(c Fund) error {
	if err := c.validate(); err != nil {
		return err
	}
	if c.Seq != 0 && c.Seq < s.upSeq {
		return fmt.Errorf("lease: fund %q with the answer to upstream seq %d, older than %d already funded: %w", c.Quota, c.Seq, s.upSeq, ErrStale)
	}
	q := s.quotas[c.Quota]
	if q == nil {
		return fmt.Errorf("lease: fund %q: %w", c.Quota, ErrUnknownQuota)
	}
	if !q.base.Funded {
		return fmt.Errorf("lease: fund %q: %w: the quota is not configured as funded", c.Quota, ErrInvalid)
	}
	s.advance(c.Now)
	q.refill(s.now)
	s.upSeq = max(s.upSeq, c.Seq)
	q.fund = Funding{Burst: c.Burst, Rate: c.Rate, NotAfter: c.NotAfter}
	if !q.fund.Active(s.now) {
		q.fund = Funding{}
	}
	q.reshape()
	if q.fund.Active(s.now) {
		q.credit(c.Deposit)
	}
	q.settle()
	return nil
}

// UpstreamSeq is the largest upstream sequence number whose answer a Fund
// applied (0 if none): a regional leader numbers its upstream requests past
// it, so no answer already funded is ever answered to it again.
func (s *State) UpstreamSeq() uint64 { return s.upSeq }

// newQuota creates quota name with shape cfg at now. A new bucket starts
// full; a funded one holds only its own part until an upstream lease funds
// it. This is also exactly the state in which Tick removes a quota (see
// idle), so removing and recreating one loses and mints nothing; except a
// StartEmpty quota, which starts with an empty pool, so that recreating it
// loses its tokens (under-use, never more).
func (s *State) newQuota(name string, cfg QuotaConfig) *quota {
	pool := cfg.Burst
	if cfg.StartEmpty {
		pool = 0
	}
	q := &quota{
		name: name, cfg: cfg, base: cfg,
		pool: pool, poolAt: s.now,
		ceilBurst: cfg.Burst, ceilRate: cfg.Rate,
		byHolder: map[string]*lease{},
	}
	s.quotas[name] = q
	s.peak.quotas = max(s.peak.quotas, len(s.quotas))
	s.count(cfg.Rule, 1)
	return q
}

// renewed creates quota name at shape cfg in place of old (nil, or an idle
// quota). An idle quota is exactly a new one of its shape, and Tick removes
// it: so that a shape change means the same whether or not a Tick has run
// since the quota went idle, a new shape for an idle quota starts it
// afresh, as a new quota (full at the new B), where a quota in use only
// gets room (raising B adds room, not tokens).
func (s *State) renewed(old *quota, name string, cfg QuotaConfig) *quota {
	if old != nil {
		s.removeQuota(old)
	}
	return s.newQuota(name, cfg)
}

// admits reports (as an error wrapping ErrTooManySubjects) whether quota
// name of shape cfg may not be created in place of old (nil, or an idle
// quota it replaces): its rule has MaxSubjects quotas without old.
func (s *State) admits(name string, cfg QuotaConfig, old *quota) error {
	n := s.subjects[cfg.Rule]
	if old != nil && old.base.Rule == cfg.Rule && cfg.Rule != "" {
		n--
	}
	if cfg.MaxSubjects > 0 && n >= cfg.MaxSubjects {
		return fmt.Errorf("quota %q: rule %q has %d quotas, max_subjects %d: %w",
			name, cfg.Rule, n, cfg.MaxSubjects, ErrTooManySubjects)
	}
	return nil
}

// count adds d to the quotas counted for rule.
func (s *State) count(rule string, d int) {
	if rule == "" {
		return
	}
	if n := s.subjects[rule] + d; n > 0 {
		s.subjects[rule] = n
	} else {
		delete(s.subjects, rule)
	}
}

// idle reports whether q is exactly what newQuota would create from its
// shape: no lease, no funding, the pool full (P = B, its whole room) and
// the ceilings back at B and r. Only the time of the pool differs, and a
// full pool stays full. q must be refilled to now and settled.
func (q *quota) idle() bool {
	return len(q.leases) == 0 && q.fund == (Funding{}) && q.pool >= q.cfg.Burst &&
		q.ceilBurst == q.cfg.Burst && q.ceilRate == q.cfg.Rate
}

// idleAt reports whether q would be idle at now (see idle), as Tick would
// find it, without changing q: it refills and settles a copy (which shares
// only the leases, read, of which there are none).
func (q *quota) idleAt(now int64) bool {
	if len(q.leases) > 0 {
		return false
	}
	c := *q
	c.refill(now)
	c.settle()
	return c.idle()
}

// removeQuota forgets an idle quota.
func (s *State) removeQuota(q *quota) {
	delete(s.quotas, q.name)
	s.count(q.base.Rule, -1)
}

// compact rebuilds a map that has shrunk to a quarter of its peak size: a
// Go map keeps the memory of its largest size, and ranging over it costs
// that size, so without this a burst of a million subjects would cost
// memory and Tick time long after they were removed. It changes no state.
func (s *State) compact() {
	const floor = 1024
	if p := s.peak.quotas; p >= floor && len(s.quotas) <= p/4 {
		s.quotas = rebuilt(s.quotas)
		s.peak.quotas = len(s.quotas)
	}
	if p := s.peak.leases; p >= floor && len(s.leases) <= p/4 {
		s.leases = rebuilt(s.leases)
		s.peak.leases = len(s.leases)
	}
	if p := s.peak.holders; p >= floor && len(s.holders) <= p/4 {
		s.holders = rebuilt(s.holders)
		s.peak.holders = len(s.holders)
	}
}

// rebuilt copies m into a map sized for what it holds (maps.Clone would
// copy its tables, at their old size).
func rebuilt[K comparable, V any](m map[K]V) map[K]V {
	n := make(map[K]V, len(m))
	for k, v := range m {
		n[k] = v
	}
	return n
}

// effective is the shape conservation is held to: base, plus the funding.
func (q *quota) effective() QuotaConfig {
	c := q.base
	c.Burst += q.fund.Burst
	c.Rate += q.fund.Rate
	return c
}

// reshape applies a new effective shape at poolAt: the pool gives up what
// no longer fits, and the ceilings cover what is still reserved.
func (q *quota) reshape() {
	q.cfg = q.effective()
	resCap, resRate := q.reserved()
	q.pool = min(q.pool, max(0, q.cfg.Burst-resCap))
	q.ceilBurst = max(q.cfg.Burst, resCap+q.pool)
	q.ceilRate = max(q.cfg.Rate, resRate)
}

// holderCommand runs the idempotence protocol around a validated holder
// command: replay or refuse an old Seq, otherwise apply and record.
func (s *State) holderCommand(name string, seq uint64, now int64, kind Kind, apply func() answer) (Result, error) {
	h := s.holders[name]
	if h != nil && seq <= h.seq {
		if seq == h.seq && h.answer.Kind == kind {
			r, err := h.answer.result(name)
			r.Replayed = true
			return r, err
		}
		return Result{}, fmt.Errorf("lease: %s by %q: seq %d, last applied %d (%s): %w",
			kind, name, seq, h.seq, h.answer.Kind, ErrStale)
	}
	s.advance(now)
	if h == nil {
		h = &holder{}
		s.holders[name] = h
		s.peak.holders = max(s.peak.holders, len(s.holders))
	}
	ans := apply()
	h.seq, h.at, h.answer = seq, s.now, ans
	return ans.result(name)
}

func (s *State) grant(c Grant) (Result, error) {
	if err := c.validate(); err != nil {
		return Result{}, err
	}
	if s.quotas[c.Quota] == nil && c.Config == nil && !s.replay(c.Holder, c.Seq) {
		return Result{}, fmt.Errorf("lease: grant %q to %q: %w", c.Quota, c.Holder, ErrUnknownQuota)
	}
	return s.holderCommand(c.Holder, c.Seq, c.Now, KindGrant, func() answer {
		q := s.quotas[c.Quota]
		// c.Config is set when q is nil: without it, the command was
		// refused above (holderCommand only applies what is not a replay).
		if q == nil || c.Config != nil && q.base != *c.Config && q.idleAt(s.now) {
			if s.admits(c.Quota, *c.Config, q) != nil {
				return answer{Kind: KindGrant, Code: codeTooManySubjects}
			}
			q = s.renewed(q, c.Quota, *c.Config)
		}
		q.refill(s.now)
		l := q.byHolder[c.Holder]
		switch {
		case l == nil:
			l = s.addLease(q, c.Holder)
		case s.now > l.Expiry:
			// The old term is over: the holder knows its old balance is
			// forfeit, and it gets a new ID so that renewals of the old one
			// keep failing. The record (its reservations) carries over.
			delete(s.leases, l.ID)
			q.resDel(l)
			q.fillDel(l)
			l.ID = s.nextID
			l.retag()
			q.resAdd(l)
			s.nextID++
			s.leases[l.ID] = l
		}
		l.Demand, l.Weight, l.Bounds = c.Demand, weightOr1(c.Weight), c.Bounds.clone()
		q.purge(s.now)
		q.fillSync(l) // in the share even if its old term is over
		out, _ := s.resize(q, l, 0, false, q.targets(s.now, l).of(l))
		q.settle()
		return answer{Kind: KindGrant, Lease: &out}
	})
}

// replay reports whether a holder command with seq is answered from the
// record or refused as stale, without being applied.
func (s *State) replay(holder string, seq uint64) bool {
	h := s.holders[holder]
	return h != nil && seq <= h.seq
}

func (s *State) renew(c Renew) (Result, error) {
	if err := c.validate(); err != nil {
		return Result{}, err
	}
	return s.holderCommand(c.Holder, c.Seq, c.Now, KindRenew, func() answer {
		items := make([]itemAnswer, len(c.Items))
		live := make([]*lease, len(c.Items))
		// Record every item's demand first, so that the shares decided for
		// the items of this command all see the same demands.
		for i, it := range c.Items {
			items[i] = itemAnswer{LeaseID: it.LeaseID, Quota: it.Quota}
			// A quota that does not exist has no live lease: it was never
			// created, or removed once idle. Either way the holder must
			// ask for a new grant, which recreates it.
			l := s.leases[it.LeaseID]
			if s.quotas[it.Quota] == nil || l == nil || l.Holder != c.Holder || l.Quota != it.Quota || s.now > l.Expiry {
				items[i].Code = codeLeaseExpired
				continue
			}
			l.Demand, l.Weight, l.Bounds = it.Demand, weightOr1(it.Weight), it.Bounds.clone()
			s.quotas[it.Quota].fillSync(l)
			live[i] = l
		}
		targets := map[*quota]targeter{}
		var touched []*quota
		for i, l := range live {
			if l == nil {
				continue
			}
			q := s.quotas[l.Quota]
			t, ok := targets[q]
			if !ok {
				q.refill(s.now)
				q.purge(s.now)
				t = q.targets(s.now, nil)
				targets[q] = t
				touched = append(touched, q)
			}
			it := c.Items[i]
			confirmed := it.ConfirmedCap == l.Cap && it.ConfirmedRate == l.Rate
			out, credited := s.resize(q, l, it.Unused, confirmed, t.of(l))
			items[i].Lease, items[i].Credited = &out, credited
		}
		for _, q := range touched {
			q.settle()
		}
		return answer{Kind: KindRenew, Items: items}
	})
}

func (s *State) release(c Release) (Result, error) {
	if err := c.validate(); err != nil {
		return Result{}, err
	}
	return s.holderCommand(c.Holder, c.Seq, c.Now, KindRelease, func() answer {
		l := s.leases[c.LeaseID]
		if l == nil || l.Holder != c.Holder {
			return answer{Kind: KindRelease, LeaseID: c.LeaseID, Code: codeLeaseExpired}
		}
		q := s.quotas[l.Quota]
		q.refill(s.now)
		var back float64
		if s.now <= l.Expiry {
			// After expiry the holder may have spent what it reports (it
			// stops at its own expiry, which the coordinator cannot see), so
			// only a live lease's return is credited.
			l.accrue(s.now)
			back = min(c.Unused, l.Bound)
		}
		// The holder stopped spending when it sent the release, under this
		// and every older answer: nothing of the lease stays reserved.
		s.removeLease(q, l)
		credited := q.credit(back)
		q.settle()
		return answer{Kind: KindRelease, LeaseID: c.LeaseID, Credited: credited}
	})
}

func (s *State) tick(c Tick) (Result, error) {
	if err := c.validate(); err != nil {
		return Result{}, err
	}
	s.advance(c.Now)
	var reclaimed []uint64
	// Each quota's step reads and writes that quota, its leases and the
	// holders' lease counts (a sum) only, and reclaimed is sorted below:
	// the order of the map cannot reach the state or the answer, so no
	// sort of every name is needed, and the walk costs the quotas there
	// are, which idle ones leave.
	for _, q := range s.quotas {
		q.refill(s.now)
		// Backwards, so that removing a lease leaves the ones still to
		// visit in place (each lease's step is its own).
		for i := len(q.leases) - 1; i >= 0; i-- {
			l := q.leases[i]
			switch {
			case l.ReclaimAt < s.now:
				// Its unreturned tokens are lost, not credited: the holder
				// may have spent them.
				reclaimed = append(reclaimed, l.ID)
				s.removeLease(q, l)
			case l.ResUntil < s.now && (l.ResCap > l.Cap || l.ResRate > l.Rate):
				l.accrue(s.now)
				l.collapse()
				q.resSync(l)
			}
		}
		q.settle()
		if q.idle() && !s.keepIdle {
			s.removeQuota(q)
		}
	}
	for name, h := range s.holders {
		if h.leases == 0 && s.now-h.at > RecordTTL {
			delete(s.holders, name)
		}
	}
	s.compact()
	slices.Sort(reclaimed)
	return Result{Reclaimed: reclaimed}, nil
}

func (s *State) leaderElected(c LeaderElected) error {
	if err := c.validate(); err != nil {
		return err
	}
	prev := s.now
	for _, q := range s.quotas {
		q.refill(prev)
		for _, l := range q.leases {
			l.accrue(prev)
		}
	}
	s.advance(c.Now)
	for _, q := range s.quotas {
		// prev and now come from two different clocks: refilling over the
		// jump between them could mint tokens, so the pools skip it.
		q.poolAt = s.now
		for _, l := range q.leases {
			l.BoundAt = s.now
			ext := s.now + l.Term + q.cfg.SafetyMargin
			l.ReclaimAt = max(l.ReclaimAt, ext)
			if l.ResCap > l.Cap || l.ResRate > l.Rate {
				l.ResUntil = max(l.ResUntil, ext)
			}
		}
		if q.fund != (Funding{}) {
			// NotAfter was measured on the old leader's clock: the new
			// leader funds the quota again from its own upstream lease.
			q.fund = Funding{}
			q.reshape()
			q.settle()
		}
	}
	return nil
}

// addLease creates an empty lease record (no sizes, no tokens).
func (s *State) addLease(q *quota, name string) *lease {
	l := &lease{ID: s.nextID, Holder: name, Quota: q.name, BoundAt: s.now, Weight: 1}
	s.nextID++
	s.leases[l.ID] = l
	s.peak.leases = max(s.peak.leases, len(s.leases))
	q.leases = append(q.leases, l)
	q.byHolder[name] = l
	q.resAdd(l)
	s.holders[name].leases++
	return l
}

func (s *State) removeLease(q *quota, l *lease) {
	delete(s.leases, l.ID)
	delete(q.byHolder, l.Holder)
	q.resDel(l)
	q.fillDel(l)
	q.leases = slices.DeleteFunc(q.leases, func(x *lease) bool { return x == l })
	if h := s.holders[l.Holder]; h != nil {
		h.leases--
	}
}

// resize answers a renewal (or a grant, with unused 0 and nothing confirmed)
// of live lease l: credit what the holder gave back, size the lease towards
// its target within what is free, top its bucket up from the pool and start
// a new term. q must be refilled to now. It returns the answer and the credit.
func (s *State) resize(q *quota, l *lease, unused float64, confirmed bool, t target) (Lease, float64) {
	defer q.expirySync(l)
	now := s.now
	l.accrue(now)
	// What the holder could not possibly have had is not credited: a buggy
	// or lying report cannot mint tokens beyond the lease's bound.
	back := min(unused, l.Bound)
	l.Bound -= back
	if confirmed || l.ResUntil < now {
		l.collapse()
		q.resSync(l)
	}
	credited := q.credit(back)

	period := l.period(q)
	handOver := q.handingOver(now, period)
	if handOver {
		t = q.handOverTarget(t, l)
	}
	otherCap, otherRate := q.reservedExcept(l)
	newCap := max(0, min(t.cap, q.cfg.Burst-otherCap))
	newRate := max(0, min(t.rate, q.cfg.Rate-otherRate))
	if newCap < l.ResCap || newRate < l.ResRate {
		// A shrink: until the holder confirms it, or every older answer's
		// term is over, the holder may still spend at the old sizes.
		l.ResUntil = max(l.ResUntil, l.ReclaimAt)
	}
	l.ResCap, l.ResRate = max(l.ResCap, newCap), max(l.ResRate, newRate)
	l.Cap, l.Rate = newCap, newRate
	q.resSync(l)

	// Fill the holder's bucket up to its new cap from the pool. Bound is an
	// upper bound of what it holds, so this never overfills an honest holder
	// and always takes at least the pool tokens a grow leaves no room for
	// (see doc.go); the clamp below only bites when the quota is
	// over-committed after a configuration change.
	give := min(q.pool, max(0, newCap-l.Bound))
	q.pool -= give
	l.Bound += give
	resCap, _ := q.reserved()
	q.pool = min(q.pool, max(0, q.cfg.Burst-resCap))

	// A sublease never outlives its parent: while funded, no term ends
	// after the funding's end (refill dropped it if that has passed),
	// except a hand-over answer, which the own part backs (handover.go).
	if q.fund.Active(now) && !handOver {
		period = min(period, q.fund.NotAfter-now)
	}
	l.Term = max(l.Term, period)
	l.Expiry = now + period
	l.ReclaimAt = max(l.ReclaimAt, l.Expiry+q.cfg.SafetyMargin)
	return Lease{
		ID: l.ID, Quota: q.name, Holder: l.Holder, Balance: give,
		Cap: newCap, Rate: newRate, Expiry: l.Expiry, Term: period,
	}, credited
}

// tune applies a Tune (see Tune for the safe-share rules).
func (s *State) tune(c Tune) error {
	key := c.Tuning.Key()
	old, had := s.tunings[key]
	switch c.Safe {
	case SafeSettle:
		s.advance(c.Now)
		if had && old.SafeShare != nil && *old.SafeShare == *c.Tuning.SafeShare {
			old.SafePrev = nil
			s.tunings[key] = old
		}
		return nil
	case SafeLearn:
		s.advance(c.Now)
		if !had {
			old = Tuning{Rule: c.Tuning.Rule, Region: c.Tuning.Region}
		}
		v := *c.Tuning.SafeShare
		old.SafeShare, old.SafePrev = &v, nil
		s.tunings[key] = old
		return nil
	}
	t := c.Tuning.clone()
	if c.Clear {
		t = Tuning{Rule: c.Tuning.Rule, Region: c.Tuning.Region}
	}
	if t.SafeShare == nil || c.Clear {
		t.SafeShare, t.SafePrev = old.SafeShare, old.SafePrev
	} else {
		if old.Pending() {
			return fmt.Errorf("%w: tune %q region %q: safe_share: a change from %v to %v is pending", ErrInvalid, t.Rule, t.Region, *old.SafePrev, *old.SafeShare)
		}
		prev := t.SafePrev
		if old.SafeShare != nil {
			prev = old.SafeShare
		}
		t.SafePrev = nil
		if prev != nil && *prev != *t.SafeShare {
			v := *prev
			t.SafePrev = &v
		}
	}
	s.advance(c.Now)
	if t.Empty() {
		delete(s.tunings, key)
	} else {
		s.tunings[key] = t
	}
	return nil
}
