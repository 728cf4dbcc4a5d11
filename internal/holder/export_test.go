package holder

// LentOf reports what (rule, subject)'s own lease and its copy of the
// rule's default lease have lent and not been repaid.
func (l *Leases) LentOf(rule, subject string) (own, cp float64) {
	q := l.lookup(rule, subject)
	if q == nil {
		return 0, 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	own = q.h.Lent
	if q.cp != nil {
		cp = q.cp.Lent
	}
	return own, cp
}
