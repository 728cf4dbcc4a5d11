package coordinator

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/ration-dev/ration/internal/lease"
)

// MaxIncarnations is how many incarnations (holder names <id>/<anything>)
// of one agent identity may hold leases at once under TLS. An agent's
// certificate names its id, and every incarnation of the id is that agent
// (authorizeHolder); without a bound, one certificate could take a share of
// every quota per holder name it invents, and every other holder's fair
// share would shrink with each. Incarnations are for restarts: the new
// process holds while the old one's leases run out (a process that stops
// gracefully releases them; a crashed one's are reclaimed after their term
// and the safety margin). Two leave room for one restart at any moment,
// even right after a crash; a third process of one id while two hold leases
// is refused until one has none.
const MaxIncarnations = 2

// ErrTooManyIncarnations marks a grant refused because MaxIncarnations
// other incarnations of the holder's agent identity hold leases: no state
// changed. It is answered RESOURCE_EXHAUSTED.
var ErrTooManyIncarnations = errors.New("too many incarnations of one agent identity")

// incarnationGate serialises the admission of new incarnations, so that
// many asking at once cannot all pass the check before any is applied.
type incarnationGate struct {
	mu sync.Mutex
	// pending holds, by agent id, the incarnations admitted whose grants
	// are still being proposed, with the number of their requests in
	// flight.
	pending map[string]map[string]int
}

// admitIncarnation refuses a request of holder with grants (lease_id 0
// items) when holder holds no lease yet and MaxIncarnations other
// incarnations of its agent identity do (on record, or being admitted).
// The returned func ends the admission; call it once the proposal is
// applied or failed. The bound is on certificate identities, so it applies
// under TLS only: in plaintext a holder is whoever the caller says anyway.
func (n *Node) admitIncarnation(holder string, grants bool) (func(), error) {
	if n.tls == nil || !grants || strings.HasPrefix(holder, "region/") {
		return func() {}, nil
	}
	id, _, _ := strings.Cut(holder, "/")
	mine := func(h string) bool { return h == id || strings.HasPrefix(h, id+"/") }
	g := &n.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	var holding []string
	n.fsm.read(func(s *lease.State) { holding = s.HoldersWithLeases(mine) })
	others := map[string]bool{}
	for _, h := range holding {
		others[h] = true
	}
	for h := range g.pending[id] {
		others[h] = true
	}
	if !others[holder] {
		if len(others) >= MaxIncarnations {
			names := make([]string, 0, len(others))
			for h := range others {
				names = append(names, h)
			}
			slices.Sort(names)
			n.m.incarnationsRefused.Inc()
			return nil, fmt.Errorf("%w: holder %q is refused: agent %q has %d incarnations holding leases already (%q), at most %d per certificate identity; "+
				"a restarted agent's old incarnation counts until it releases its leases or they are reclaimed (after their term)",
				ErrTooManyIncarnations, holder, id, len(names), names, MaxIncarnations)
		}
	}
	if g.pending == nil {
		g.pending = map[string]map[string]int{}
	}
	if g.pending[id] == nil {
		g.pending[id] = map[string]int{}
	}
	g.pending[id][holder]++
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.pending[id][holder]--; g.pending[id][holder] <= 0 {
			delete(g.pending[id], holder)
		}
		if len(g.pending[id]) == 0 {
			delete(g.pending, id)
		}
	}, nil
}
