package holder

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/ration-dev/ration/internal/lease"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

func (l *Leases) lookup(rule, subject string) *quota {
	byRule := (*l.quotas.Load())[rule]
	if byRule == nil {
		return nil
	}
	if q, ok := byRule.Load(subject); ok {
		return q.(*quota)
	}
	return nil
}

func (l *Leases) add(rule, subject string, burst, rate float64, own bool) *quota {
	return l.addQuota(rule, subject, burst, rate, own, nil)
}

// addQuota adds (rule, subject) unless it exists, and returns the quota.
// own: ask for its lease at once. init, if set, finishes a new quota
// before anyone can see it.
func (l *Leases) addQuota(rule, subject string, burst, rate float64, own bool, init func(*quota)) *quota {
	l.mu.Lock()
	defer l.mu.Unlock()
	cur := *l.quotas.Load()
	byRule := cur[rule]
	if byRule == nil {
		next := make(map[string]*sync.Map, len(cur)+1)
		for k, v := range cur {
			next[k] = v
		}
		byRule = &sync.Map{}
		next[rule] = byRule
		l.quotas.Store(&next)
	}
	if q, ok := byRule.Load(subject); ok {
		return q.(*quota)
	}
	id := rule + "|" + subject
	now := l.Now()
	q := &quota{rule: rule, subject: subject, id: id, burst: burst, rate: rate, ready: make(chan struct{}), lastUsed: now, reportedAt: now, sampledAt: now, created: now,
		coldUntil: now + l.o.ColdStart.Microseconds(), own: own}
	q.h = lease.Holding{Quota: id, Validity: l.validity}
	if init != nil {
		init(q)
	}
	if len(id) > lease.MaxNameLen {
		// The coordinator would refuse it: never ask (the agent's request
		// checks normally stop such a subject before it gets here).
		q.invalid, q.failed = true, fmt.Sprintf("%s: quota %q is %d bytes, at most %d", itemErrInvalid, id[:32]+"...", len(id), lease.MaxNameLen)
		q.markReady()
	} else if own {
		l.fresh = append(l.fresh, q)
		l.kick()
	}
	byRule.Store(subject, q)
	l.count++
	l.m.quotas.Set(float64(l.count))
	return q
}

// flag queues q for the loop's next look at early renewals.
func (l *Leases) flag(q *quota) {
	l.mu.Lock()
	l.early = append(l.early, q)
	l.mu.Unlock()
	l.kick()
}

func (l *Leases) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Nudge is a leader's nudge arriving as the Watch stream delivers it: the
// quotas named are renewed at once, by the next Round. For drivers of
// Round (the simulator); Run's own stream calls it.
func (l *Leases) Nudge(refs []*rationv1.QuotaRef) { l.nudge(refs) }

// nudge marks the quotas the leader asked to renew at once.
func (l *Leases) nudge(refs []*rationv1.QuotaRef) {
	if len(refs) == 0 {
		// The stream was (re)established: the leader took this holder's
		// name (and certificate) for the watch.
		l.linked.Store(true)
	}
	n := 0
	for _, r := range refs {
		q := l.lookup(r.GetRule(), r.GetSubject())
		if q == nil {
			continue
		}
		q.mu.Lock()
		q.nudged = true
		q.mu.Unlock()
		l.flag(q)
		n++
	}
	l.m.nudges.Add(float64(n))
}

func (l *Leases) takeFresh() []*quota {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.fresh
	l.fresh = nil
	return f
}

func (l *Leases) takeEarly() []*quota {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.early
	l.early = nil
	return e
}

func (l *Leases) snapshot() []*quota {
	l.mu.Lock()
	n := l.count
	l.mu.Unlock()
	out := make([]*quota, 0, n+8)
	for _, m := range *l.quotas.Load() {
		m.Range(func(_, v any) bool {
			out = append(out, v.(*quota))
			return true
		})
	}
	if l.o.SortedScans {
		slices.SortFunc(out, func(a, b *quota) int { return strings.Compare(a.id, b.id) })
	}
	return out
}

// remove forgets idle quotas; a decision racing with it may still spend the
// removed quota's (released, so invalid) holding and falls to its policy
// once, then re-acquires.
func (l *Leases) remove(qs []*quota) {
	// Copies of a default lease first (their quota's lock is taken after
	// the default quota's, and neither under l.mu): a copy spent since the
	// loop looked stays, with its quota.
	now := l.Now()
	keep := qs[:0:0]
	for _, q := range qs {
		if d := q.def; d != nil {
			d.mu.Lock()
			q.mu.Lock()
			ok := q.evictable(now)
			if ok {
				delete(d.copies, q)
				q.cp, q.removed = nil, true
			}
			q.mu.Unlock()
			d.mu.Unlock()
			if !ok {
				continue
			}
		} else if q.isDefault {
			q.mu.Lock()
			ok := len(q.copies) == 0
			q.removed = ok
			q.mu.Unlock()
			if !ok {
				continue
			}
		}
		keep = append(keep, q)
	}
	qs = keep
	l.mu.Lock()
	defer l.mu.Unlock()
	cur := *l.quotas.Load()
	for _, q := range qs {
		if m := cur[q.rule]; m != nil && m.CompareAndDelete(q.subject, q) {
			l.count--
		}
	}
	l.m.quotas.Set(float64(l.count))
}
