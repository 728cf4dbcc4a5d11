package lease

// GrantBound holds what a holder adopts from its coordinators to the
// quota's shape in the holder's own rules, whatever they answer (a
// coordinator of another group, a never-member's group of its own, one
// running other rules): the lease's cap to the rule's burst, its rate to
// the rule's rate, and the tokens deposited into it to a bucket of the
// rule's shape, full at the first grant. An honest coordinator deposits
// from a pool that refills at most at the rule's rate, so that bucket
// never binds it; one topping the balance up at every renewal deposits at
// most B + r·T in any window T, and the holder, refilling at most at r
// between grants, spends at most B + 2·r·T. The zero value is ready.
type GrantBound struct {
	tokens float64 // deposits still admissible, as of at
	at     int64
	set    bool
}

// boundSlack is the rounding a grant may carry past the rule (the
// coordinator computes shares in floating point).
const boundSlack = 1e-9

// Clamp holds l, a grant adopted at now, to burst and rate, and reports
// whether it held anything back. A burst of 0 is no shape (a quota the
// rules do not size): l is left as it is.
func (b *GrantBound) Clamp(now int64, burst, rate float64, l *Lease) bool {
	if burst <= 0 {
		return false
	}
	if !b.set {
		b.tokens, b.at, b.set = burst, now, true
	} else if now > b.at {
		b.tokens = min(burst, b.tokens+rate*float64(now-b.at)/1e6)
		b.at = now
	}
	over := false
	if l.Cap > burst*(1+boundSlack) {
		l.Cap, over = burst, true
	}
	if l.Rate > rate*(1+boundSlack) {
		l.Rate, over = rate, true
	}
	if l.Balance > b.tokens*(1+boundSlack)+boundSlack {
		l.Balance, over = b.tokens, true
	}
	b.tokens = max(0, b.tokens-l.Balance)
	return over
}

// Credit counts tokens the holder gave back as never deposited: they may
// be granted again.
func (b *GrantBound) Credit(tokens, burst float64) {
	if b.set && tokens > 0 {
		b.tokens = min(burst, b.tokens+tokens)
	}
}
