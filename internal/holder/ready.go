package holder

import (
	"fmt"
	"time"

	"github.com/ration-dev/ration/internal/rules"
)

// Readiness: before an agent takes traffic it fetches the leases it can
// know in advance, so that its first decisions are made on leases, not on
// a race between a grant and the decision's deadline.

// Prefetch starts acquiring, without waiting, the quotas of r that can be
// named before any request: the one quota of a rule without "*" keys
// (subject ""), and the default quota of a rule with lease.default_share,
// which every subject's first decision spends. A "*" rule without a
// default share has nothing to fetch: its subjects are known only when
// they come. It reports whether there was something to fetch.
func (l *Leases) Prefetch(r *rules.Rule) bool {
	switch {
	case r.Lease.DefaultShare > 0:
		if l.lookup(r.Name, rules.DefaultSubject) == nil {
			l.addDefault(r)
		}
		return true
	case !r.Wild():
		l.Prepare(r, "")
		return true
	}
	return false
}

// Fetched is "" once what Prefetch started for r is held (a lease valid
// now that can pay one token), else why not yet: no answer yet, the
// coordinator's refusal, or a lease granted empty.
//
// A lease is granted empty when the other agents hold the whole quota:
// an agent that starts while another holds all of a default lease (it was
// alone) gets a lease of size 0 until the leader has nudged the other to
// give its excess back and then this one to take it, a round trip or
// two. Ready on the empty lease, the agent's first subjects found their
// copies empty, each took a lease of its own (all of that quota, the
// agents that came after it then having to wait for theirs), and
// tenants far under their budget were refused while those shares moved.
// So readiness waits for the lease to hold a token, for at most
// ColdStart after its grant: a lease that stays empty that long is one
// whose pool was spent (a rollout restarts agents whose copies spent it,
// and the pool gets back only what their most spent copy had left), and
// it only refills at its rate, which waiting does not speed up.
func (l *Leases) Fetched(r *rules.Rule) string {
	subject := ""
	if r.Lease.DefaultShare > 0 {
		subject = rules.DefaultSubject
	} else if r.Wild() {
		return ""
	}
	q := l.lookup(r.Name, subject)
	if q == nil {
		return fmt.Sprintf("rule %s: lease not asked for yet", r.Name)
	}
	now := l.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.h.Valid(now) && (q.h.Available(now) >= 1 || now-q.grantedAt >= l.o.ColdStart.Microseconds()):
		return ""
	case q.h.Valid(now):
		return fmt.Sprintf("rule %s: lease granted empty (the other agents hold its quota), waiting for a share of it", r.Name)
	case q.failed != "":
		return fmt.Sprintf("rule %s: coordinator refused the lease: %s", r.Name, q.failed)
	default:
		return fmt.Sprintf("rule %s: no lease granted yet", r.Name)
	}
}

// Linked reports whether the coordinators have answered this holder: a
// renewal succeeded, or the leader accepted its nudge stream. Both need a
// working connection and, with mutual TLS, a certificate the
// coordinators take as this agent's.
func (l *Leases) Linked() bool { return l.linked.Load() }

// Cause says why a Spend of (r, subject) just found no valid lease, for
// the line that logs a failure policy taking over: the dependency's error
// when renewals fail, the coordinator's refusal, or a first grant that
// took longer than the cold start.
func (l *Leases) Cause(r *rules.Rule, subject string) string {
	if d := l.DownFor(); d > 0 {
		msg := "coordinators unreachable for " + d.Round(time.Millisecond).String()
		if e, _ := l.lastErr.Load().(string); e != "" {
			msg += ": " + e
		}
		return msg
	}
	if r.Lease.DefaultShare > 0 && subject != "" {
		if why := l.Fetched(r); why != "" {
			return "default lease: " + why
		}
	}
	q := l.lookup(r.Name, subject)
	if q == nil {
		return "no lease for this subject yet"
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.failed != "":
		return "coordinator refused the lease: " + q.failed
	case !q.answered():
		return fmt.Sprintf("first grant not answered within the first-grant timeout (%v)", l.o.ColdStart)
	case q.h.Valid(l.Now()):
		// Answered since the decision gave up on it.
		return fmt.Sprintf("a lease arrived only after the decision: a first grant slower than the first-grant timeout (%v), or a renewal answered after its lease expired", l.o.ColdStart)
	case q.h.Lease.ID == 0:
		return "lease lost (expired or refused on renewal), asked for again"
	default:
		return "lease expired before its renewal was answered"
	}
}
