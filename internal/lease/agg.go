package lease

// Per-quota aggregates, so that a renewal costs O(log n) in the n leases of
// its quota instead of the O(n log n) of water-filling them all afresh.
//
// They are derived state: never encoded, rebuilt on restore and Clone, and
// checked against a rebuild by CheckInvariants. Replicas must round them
// the same way, so they are kept in treaps whose shape depends only on the
// set of entries (each entry's priority is a hash of its fixed tag, not of
// the order entries came in): every node's sums are left + own + right,
// computed in that order, so a replica that applied the whole log and one
// restored from a snapshot hold the same sums, bit for bit, whatever order
// the entries were inserted and removed in.
//
// Each quota keeps:
//   - res: every lease by ID, summing its reserved cap and rate (reserved,
//     reservedExcept);
//   - live: the leases in the fair share (live ones, see fill), by expiry,
//     summing each one's floor, demand target and maximum (stage sums);
//   - evB, evC: the breakpoints of the two water-fillings of share, as
//     events that start and stop a lease's rise with the water level: one
//     walk down finds the level (see level).

import (
	"fmt"
	"math"
)

// node is an entry of a treap: ordered by (k, tag), heap-ordered by pri.
type node struct {
	k    float64
	tag  uint64
	pri  uint64
	v, s [3]float64 // own values, subtree sums
	n    int        // subtree size
	l, r *node
	ls   *lease
}

func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func newNode(tag uint64, ls *lease) *node {
	return &node{tag: tag, pri: mix(tag), ls: ls}
}

func (a *node) less(b *node) bool {
	return a.k < b.k || a.k == b.k && a.tag < b.tag
}

func (a *node) above(b *node) bool { // heap order
	return a.pri > b.pri || a.pri == b.pri && a.tag < b.tag
}

func (x *node) pull() {
	x.n = 1
	for d := range x.s {
		s := 0.0
		if x.l != nil {
			s = x.l.s[d]
		}
		s += x.v[d]
		if x.r != nil {
			s += x.r.s[d]
		}
		x.s[d] = s
	}
	if x.l != nil {
		x.n += x.l.n
	}
	if x.r != nil {
		x.n += x.r.n
	}
}

// split divides t into the entries before x and the rest.
func split(t, x *node) (a, b *node) {
	if t == nil {
		return nil, nil
	}
	if t.less(x) {
		t.r, b = split(t.r, x)
		t.pull()
		return t, b
	}
	a, t.l = split(t.l, x)
	t.pull()
	return a, t
}

func merge(a, b *node) *node {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case a.above(b):
		a.r = merge(a.r, b)
		a.pull()
		return a
	}
	b.l = merge(a, b.l)
	b.pull()
	return b
}

func insert(t, x *node) *node {
	x.l, x.r = nil, nil
	x.pull()
	if t == nil {
		return x
	}
	if x.above(t) {
		x.l, x.r = split(t, x)
		x.pull()
		return x
	}
	if x.less(t) {
		t.l = insert(t.l, x)
	} else {
		t.r = insert(t.r, x)
	}
	t.pull()
	return t
}

// remove takes x (by its key, which must not have changed) out of t.
func remove(t, x *node) *node {
	if t == nil {
		return nil
	}
	if t == x {
		return merge(t.l, t.r)
	}
	if x.less(t) {
		t.l = remove(t.l, x)
	} else {
		t.r = remove(t.r, x)
	}
	t.pull()
	return t
}

// refresh recomputes the sums on the path from t down to x, after x's own
// values changed (its key did not): the shape stays, and every sum is
// computed as a rebuild would, left + own + right.
func refresh(t, x *node) {
	if t == nil {
		return
	}
	if t != x {
		if x.less(t) {
			refresh(t.l, x)
		} else {
			refresh(t.r, x)
		}
	}
	t.pull()
}

func sums(t *node) [3]float64 {
	if t == nil {
		return [3]float64{}
	}
	return t.s
}

// except sums every entry of t but x.
func except(t, x *node) [3]float64 {
	var lo, hi [3]float64 // before x, after x
	for t != nil {
		switch {
		case t == x:
			ls, rs := sums(t.l), sums(t.r)
			for d := range lo {
				lo[d] += ls[d]
				hi[d] += rs[d]
			}
			t = nil
		case x.less(t):
			rs := sums(t.r)
			for d := range hi {
				hi[d] += t.v[d] + rs[d]
			}
			t = t.l
		default:
			ls := sums(t.l)
			for d := range lo {
				lo[d] += ls[d] + t.v[d]
			}
			t = t.r
		}
	}
	for d := range lo {
		lo[d] += hi[d]
	}
	return lo
}

func first(t *node) *node {
	for t != nil && t.l != nil {
		t = t.l
	}
	return t
}

// Indexes of a lease's nodes.
const (
	nRes = iota
	nLive
	nB0 // water-filling by demand: rise from the floor ...
	nB1 // ... stop at the demand target
	nC0 // water-filling the rest by weight: rise from the demand target ...
	nC1 // ... stop at the maximum
	nNodes
)

// limits are a lease's terms in the water-filling: floor lo, demand target
// hiD = max(lo, min(demand, max)) and maximum mx = max(lo, max).
type limits struct{ w, lo, hiD, mx float64 }

func (q *quota) limitsOf(l *lease) limits {
	lo, mx := q.cfg.MinSlice, q.cfg.MaxSlice
	if mx == 0 {
		mx = 2 * MaxValue
	}
	if b := l.Bounds; b != nil {
		lo, mx = b.MinSlice, b.MaxSlice
		if mx == 0 {
			mx = 2 * MaxValue
		}
	}
	if !(lo >= 0) || math.IsInf(lo, 0) {
		lo = 0
	}
	if math.IsNaN(mx) {
		mx = math.Inf(1)
	}
	w := l.Weight
	if !(w > 0) || math.IsInf(w, 0) {
		w = 1
	}
	d := l.Demand
	if !(d >= 0) {
		d = 0
	}
	return limits{w: w, lo: lo, hiD: max(lo, min(d, mx)), mx: max(lo, mx)}
}

// ensure gives l its nodes.
func (l *lease) ensure() {
	if l.nodes[0] != nil {
		return
	}
	for i := range l.nodes {
		l.nodes[i] = newNode(l.ID*nNodes+uint64(i), l)
	}
}

// retag gives l's nodes the tags of its (new) ID; l must be in no tree.
func (l *lease) retag() {
	for i, x := range l.nodes {
		if x != nil {
			x.tag = l.ID*nNodes + uint64(i)
			x.pri = mix(x.tag)
		}
	}
}

// resAdd and resDel put l in and out of the reserved sums; resSync follows
// a change of its reserved sizes.
func (q *quota) resAdd(l *lease) {
	l.ensure()
	x := l.nodes[nRes]
	x.v = [3]float64{l.ResCap, l.ResRate, 0}
	q.res = insert(q.res, x)
	q.resSum = sums(q.res)
}

func (q *quota) resDel(l *lease) {
	q.res = remove(q.res, l.nodes[nRes])
	q.resSum = sums(q.res)
}

func (q *quota) resSync(l *lease) {
	if x := l.nodes[nRes]; x.v[0] != l.ResCap || x.v[1] != l.ResRate {
		x.v = [3]float64{l.ResCap, l.ResRate, 0}
		refresh(q.res, x)
		q.resSum = sums(q.res)
	}
}

// fillAdd puts l in the fair share with its current demand, weight and
// bounds; fillDel takes it out.
func (q *quota) fillAdd(l *lease) {
	l.ensure()
	m := q.limitsOf(l)
	l.lim, l.inFill = m, true
	at := fillEntries(m, l.Expiry)
	for i, root := range q.fillRoots() {
		x := l.nodes[nLive+i]
		x.k, x.v = at[i].k, at[i].v
		*root = insert(*root, x)
	}
}

// fillEntry is where one of a lease's fair-share nodes sits and what it
// adds to its tree's sums.
type fillEntry struct {
	k float64
	v [3]float64
}

// fillEntries are a lease's nodes nLive..nC1 for limits m and expiry: its
// place by expiry among the live leases, and the events that start and stop
// its rise in the two water-fillings.
func fillEntries(m limits, expiry int64) [nNodes - nLive]fillEntry {
	return [nNodes - nLive]fillEntry{
		{float64(expiry), [3]float64{m.lo, m.hiD, m.mx}},
		{m.lo / m.w, [3]float64{m.w, -m.lo, 0}},
		{m.hiD / m.w, [3]float64{-m.w, m.hiD, 0}},
		{m.hiD / m.w, [3]float64{m.w, -m.hiD, 0}},
		{m.mx / m.w, [3]float64{-m.w, m.mx, 0}},
	}
}

// fillRoots are the trees of nodes nLive..nC1, in that order.
func (q *quota) fillRoots() [nNodes - nLive]**node {
	return [nNodes - nLive]**node{&q.live, &q.evB, &q.evB, &q.evC, &q.evC}
}

func (q *quota) fillDel(l *lease) {
	if !l.inFill {
		return
	}
	for i, root := range q.fillRoots() {
		*root = remove(*root, l.nodes[nLive+i])
	}
	l.inFill = false
}

// fillSync puts l in the fair share as it is now (demand, expiry), moving
// only the nodes whose place changed and refreshing the sums above those
// whose values alone did: a renewal's new demand moves its two demand
// events and changes its live entry's values (its expiry moves later, in
// resize); weight and bounds, which move the other two, rarely change.
// The trees come out as a full take-out and put-back would leave them,
// since a treap's shape and sums depend only on what it holds.
func (q *quota) fillSync(l *lease) {
	if !l.inFill {
		q.fillAdd(l)
		return
	}
	m := q.limitsOf(l)
	at := fillEntries(m, l.Expiry)
	for i, root := range q.fillRoots() {
		x := l.nodes[nLive+i]
		if x.k == at[i].k {
			if x.v != at[i].v {
				x.v = at[i].v
				refresh(*root, x)
			}
			continue
		}
		*root = remove(*root, x)
		x.k, x.v = at[i].k, at[i].v
		*root = insert(*root, x)
	}
	l.lim = m
}

// expirySync follows a change of l's expiry alone.
func (q *quota) expirySync(l *lease) {
	if x := l.nodes[nLive]; l.inFill && x.k != float64(l.Expiry) {
		q.live = remove(q.live, x)
		x.k = float64(l.Expiry)
		q.live = insert(q.live, x)
	}
}

// purge takes the leases expired at now out of the fair share.
func (q *quota) purge(now int64) {
	for x := first(q.live); x != nil && x.k < float64(now); x = first(q.live) {
		q.fillDel(x.ls)
	}
}

// fresh reports whether the fair share holds exactly the leases live at
// now (nothing expired is left to purge).
func (q *quota) fresh(now int64) bool {
	x := first(q.live)
	return x == nil || x.k >= float64(now)
}

// rebuild recomputes every aggregate of q from its leases: those live at
// now are in the fair share.
func (q *quota) rebuild(now int64) {
	q.res, q.live, q.evB, q.evC, q.resSum = nil, nil, nil, nil, [3]float64{}
	for _, l := range q.leases {
		l.nodes = [nNodes]*node{}
		l.inFill = false
		q.resAdd(l)
		if now <= l.Expiry {
			q.fillAdd(l)
		}
	}
}

// refit follows a change of the quota's slice bounds.
func (q *quota) refit() {
	for _, l := range q.leases {
		if l.inFill {
			q.fillSync(l)
		}
	}
}

// waterLevel finds the water level L of one water-filling: the events of ev,
// rising from a total of base (the sum of the floors), filled to capacity.
// The total at level L is base + L*(sum of w started) + (sum of dc
// started): a start event adds w*L - lo, a stop event takes w*L - hi away.
// It is nondecreasing in L, so one walk down the events finds the last one
// at which the total is still within capacity. ok is false when rounding
// left no positive slope there.
func waterLevel(ev *node, base, capacity float64) (L float64, ok bool) {
	var accW, accC float64
	var best *node
	var bestW, bestC float64
	for x := ev; x != nil; {
		ls := sums(x.l)
		pw, pc := accW+ls[0], accC+ls[1]
		if base+x.k*pw+pc <= capacity {
			best = x
			accW, accC = pw+x.v[0], pc+x.v[1]
			bestW, bestC = accW, accC
			x = x.r
		} else {
			x = x.l
		}
	}
	if best == nil || !(bestW > 0) {
		return 0, false
	}
	return max(best.k, (capacity-base-bestC)/bestW), true
}

// filling is how one water-filling (of r, or of B scaled) came out.
type filling struct {
	stage int // fillAll: every lease at its maximum; fillB, fillC: L
	L     float64
	scale float64 // the targets are scale * the lease's share
}

const (
	fillNone = iota // not computed here: use the full computation
	fillZero
	fillB
	fillC
	fillAll
)

func (q *quota) fill(capacity, scale float64) filling {
	if !(capacity > 0) {
		return filling{stage: fillZero}
	}
	capacity /= scale
	s := sums(q.live)
	switch {
	case s[0] > capacity:
		// The floors do not fit (a quota whose rate fell below its slices):
		// rare; the full computation shares them.
		return filling{}
	case s[1] > capacity:
		if L, ok := waterLevel(q.evB, s[0], capacity); ok {
			return filling{stage: fillB, L: L, scale: scale}
		}
		return filling{}
	case s[2] <= capacity:
		return filling{stage: fillAll, scale: scale}
	}
	if L, ok := waterLevel(q.evC, s[1], capacity); ok {
		return filling{stage: fillC, L: L, scale: scale}
	}
	return filling{}
}

func (f filling) of(m limits) float64 {
	switch f.stage {
	case fillB:
		return f.scale * min(max(f.L*m.w, m.lo), m.hiD)
	case fillC:
		return f.scale * min(max(f.L*m.w, m.hiD), m.mx)
	case fillAll:
		return f.scale * m.mx
	}
	return 0
}

// checkAgg compares q's aggregates with ones built afresh from its leases
// (CheckInvariants): a step that changed a lease without following it in
// the aggregates, or sums that depend on the order of the steps, show here.
func (q *quota) checkAgg(now int64) []string {
	var bad []string
	c := &quota{cfg: q.cfg}
	for _, l := range q.leases {
		x := *l
		x.nodes, x.inFill = [nNodes]*node{}, false
		c.resAdd(&x)
		if l.inFill {
			c.fillAdd(&x)
			if l.lim != q.limitsOf(l) || l.nodes[nLive].k != float64(l.Expiry) {
				bad = append(bad, fmt.Sprintf("lease %d: in the fair share at %+v expiry %v, is %+v expiry %d",
					l.ID, l.lim, l.nodes[nLive].k, q.limitsOf(l), l.Expiry))
			}
		} else if now <= l.Expiry {
			bad = append(bad, fmt.Sprintf("lease %d: live but not in the fair share", l.ID))
		}
	}
	for _, t := range []struct {
		name      string
		got, want *node
	}{{"reserved", q.res, c.res}, {"live", q.live, c.live}, {"demand events", q.evB, c.evB}, {"leftover events", q.evC, c.evC}} {
		if sums(t.got) != sums(t.want) || size(t.got) != size(t.want) || sums(q.res) != q.resSum {
			bad = append(bad, fmt.Sprintf("%s: sums %v of %d, rebuilt %v of %d", t.name, sums(t.got), size(t.got), sums(t.want), size(t.want)))
		}
	}
	return bad
}

func size(t *node) int {
	if t == nil {
		return 0
	}
	return t.n
}
