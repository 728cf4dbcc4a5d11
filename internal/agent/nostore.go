package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/rules"
)

// An agent whose rules are all mode: leased decides from its leases and
// never calls a store, so it runs without -redis. Nothing may then bring a
// mode: redis rule in: Start refuses such a rules file, and a reload that
// adds one is refused while the rules in force stay (acceptedRules).

// errNoStore is what noStore answers; no decision should ever see it.
var errNoStore = errors.New("agent: no store: this agent runs without -redis")

// noStore is the Store of an agent without -redis. It answers Ping, so the
// agent is ready as soon as it listens: its leased rules decide from their
// leases, or by their failure policies while the coordinators are away.
type noStore struct{}

func (noStore) Take(context.Context, bucket.Request) (bucket.Result, error) {
	return bucket.Result{}, errNoStore
}

func (noStore) TakeBatch(_ context.Context, reqs []bucket.Request, out []bucket.Outcome) {
	for i := range reqs {
		out[i] = bucket.Outcome{Err: errNoStore}
	}
}

func (noStore) Refund(context.Context, bucket.Request) error { return errNoStore }
func (noStore) Ping(context.Context) error                   { return nil }

// redisRules names the rules of set that need a store (mode: redis).
func redisRules(set *rules.Set) []string {
	var out []string
	for _, r := range set.Rules() {
		if r.Mode == rules.ModeRedis || r.Mode == rules.ModeAuto {
			out = append(out, r.Name)
		}
	}
	return out
}

// checkStoreless is nil when set can run without a store, else the error
// that names its mode: redis rules.
func checkStoreless(set *rules.Set) error {
	if names := redisRules(set); len(names) > 0 {
		return fmt.Errorf("-redis: rules %v are mode: redis or auto and need the region's Redis; "+
			"only an agent whose rules are all mode: leased runs without -redis", names)
	}
	return nil
}

// acceptedRules is the RuleSource of an agent that watches a rules file:
// the last set the watcher loaded that the agent also accepted. A set the
// agent refuses (checkStoreless, without a store) leaves the previous one
// in force, and the refusal is what Reload reports until the file changes.
type acceptedRules struct {
	current atomic.Pointer[rules.Set]

	mu      sync.Mutex
	refused error // why the watcher's latest set is not in force; nil when it is
}

func newAcceptedRules(set *rules.Set) *acceptedRules {
	a := &acceptedRules{}
	a.current.Store(set)
	return a
}

// Current returns the rules in force (one atomic load).
func (a *acceptedRules) Current() *rules.Set { return a.current.Load() }

func (a *acceptedRules) accept(set *rules.Set) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.current.Store(set)
	a.refused = nil
}

func (a *acceptedRules) refuse(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refused = err
}

// refusal is why the rules file's current content is not in force, or nil.
func (a *acceptedRules) refusal() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.refused
}
