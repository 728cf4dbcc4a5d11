package agent

import (
	"fmt"
	"unicode/utf8"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/rules"
)

// checkStep validates what a request asks of one matched rule, before any
// I/O: the rule's share in this region, the charge against its bucket (a
// cost over the burst can never be admitted) and, for a leased rule, a
// quota the coordinator can grant. shared is whether the rule has a share
// in this region; lazyKey whether br.Key is left for step.key to make.
//
// Every check is the rule's own: the request itself (its cost, its id, its
// subject) was validated by match. So an error here is this rule's verdict
// on the request, which prepare enforces for a rule and only reports for a
// shadow rule (neverAdmits).
func (s *Service) checkStep(m rules.Match, br *bucket.Request, shared, lazyKey bool) error {
	if !shared {
		return fmt.Errorf("%w: rule %s is scope: global and has no share for region %q", ErrInvalidRequest, m.Rule.Name, s.cfg.Region)
	}
	if lazyKey {
		br.Key = pendingKey // what Validate checks of it: Key never makes an empty key
		defer func() { br.Key = "" }()
	}
	if err := br.Validate(); err != nil {
		return fmt.Errorf("%w: rule %s: %w", ErrInvalidRequest, m.Rule.Name, err)
	}
	// The coordinator names a leased quota rule|subject and refuses
	// longer names; such a request can never be granted, and sent on it
	// would fail the renewal of every lease of this agent.
	if m.Rule.Mode == rules.ModeLeased {
		if n := len(m.Rule.Name) + 1 + len(m.Subject); n > lease.MaxNameLen {
			return fmt.Errorf("%w: rule %s is leased and its quota id (rule|subject) would be %d bytes, at most %d: use a shorter subject (descriptor values)",
				ErrInvalidRequest, m.Rule.Name, n, lease.MaxNameLen)
		}
		if !utf8.ValidString(m.Subject) {
			return fmt.Errorf("%w: rule %s is leased and its subject is not valid UTF-8", ErrInvalidRequest, m.Rule.Name)
		}
	}
	return nil
}

// neverAdmits makes st the verdict of a shadow rule on a request it could
// never admit as sent (checkStep's error: a cost over its burst, a quota
// its coordinator would not grant, no share in this region). A shadow
// rule's verdicts are reported, never enforced, and refusing the request
// would enforce this one, on a request the rules in force may admit. So
// the step is a denial like the shadow rule's others: combine answers the
// request by the other rules (reason shadow), ration_decisions_total counts
// it (path none: no bucket or lease was touched, no quota asked for,
// nothing charged), and the admission log records it.
func neverAdmits(st *step) {
	st.never = true
	st.allowed, st.reason = false, ReasonOverLimit
	st.limit = st.req.Limit
}
