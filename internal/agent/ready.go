package agent

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/rules"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

// Readiness means "can decide every rule": /readyz turns 200 only once
// the store has answered and is warm (scripts loaded, connections open),
// the coordinators have answered this agent (with mutual TLS: its
// certificate names its -id), and the leases that can be named before any
// request (a leased rule without "*" keys, every default-share rule's
// default lease) are held. A rolling restart then sends traffic to an
// agent whose first decisions are made by their rules, not by a race of
// a grant or a handshake against -decision-timeout.
//
// It is latched: once ready, the agent stays ready through later outages
// (its failure policies decide then), or a whole fleet would leave its
// load balancer at once when the coordinators or Redis fail.

// leaseReadiness is the optional part of Leases that readiness uses
// (holder.Leases has it).
type leaseReadiness interface {
	Prefetch(r *rules.Rule) bool
	Fetched(r *rules.Rule) string
	Linked() bool
}

// readyPoll is how often readiness is looked at until it holds.
const readyPoll = 50 * time.Millisecond

// waitReady looks at readiness until it holds, then calls onReady.
func (c *Core) waitReady(ctx context.Context, onReady func()) {
	c.prefetch(c.Service.rules.Current())
	last := ""
	for {
		why := c.notReady(ctx)
		if why == "" {
			break
		}
		c.why.Store(why)
		if why != last {
			c.logger.Info("not ready yet", "waiting_for", why)
			last = why
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(readyPoll):
		}
	}
	c.why.Store("")
	c.ready.Store(true)
	c.logger.Info("ready: store warm, coordinators answered, leases held")
	if c.evictionPolicy != "" {
		v := 0.0
		if c.evictionWarning == "" {
			v = 1
		}
		c.Service.metrics.redisEvictionSafe.Set(v)
	}
	if onReady != nil {
		onReady()
	}
}

// prefetch starts acquiring the leases of set that can be named now.
func (c *Core) prefetch(set *rules.Set) {
	lr, ok := c.Service.leases.(leaseReadiness)
	if !ok {
		return
	}
	for _, r := range set.Rules() {
		if r.Mode == rules.ModeLeased {
			lr.Prefetch(r)
		}
	}
}

// notReady is "" when the agent can decide every rule, else what it
// waits for.
func (c *Core) notReady(ctx context.Context) string {
	if !c.storeOK {
		if err := c.Service.Probe(ctx); err != nil {
			return fmt.Sprintf("store has not answered yet: %v", err)
		}
		if rs, ok := c.Service.store.(*bucket.RedisStore); ok {
			wctx, cancel := context.WithTimeout(ctx, bucket.DefaultWarmTimeout)
			err := rs.Warm(wctx, bucket.WarmConns)
			cancel()
			if err != nil {
				return fmt.Sprintf("store warm-up (script load, connections) failed: %v", err)
			}
		}
		c.storeOK = true
	}
	set := c.Service.rules.Current()
	if !slices.ContainsFunc(set.Rules(), func(r *rules.Rule) bool { return r.Mode.Leases() }) {
		return ""
	}
	if c.tls != nil && c.devCoordinator == nil && c.cfg.Coordinators != "" {
		if leaf := c.tls.Leaf(); !tlsfiles.Has(leaf, tlsfiles.RoleAgent, c.cfg.AgentID) {
			return fmt.Sprintf("%s names agents %q, not this one (-id %q needs URI SAN %s): the coordinators refuse its leases",
				c.opts.name("-tls-cert"), tlsfiles.Names(leaf, tlsfiles.RoleAgent), c.cfg.AgentID, tlsfiles.URI(tlsfiles.RoleAgent, c.cfg.AgentID))
		}
	}
	lr, ok := c.Service.leases.(leaseReadiness)
	if !ok {
		return ""
	}
	if !lr.Linked() {
		return "the coordinators have not answered this agent yet"
	}
	for _, r := range set.Rules() {
		if r.Mode != rules.ModeLeased {
			continue
		}
		if why := lr.Fetched(r); why != "" {
			return why
		}
	}
	return ""
}

// NotReady is why the agent is not ready yet, "" once it is.
func (c *Core) NotReady() string {
	if c.ready.Load() {
		return ""
	}
	if why, _ := c.why.Load().(string); why != "" {
		return why
	}
	return "starting"
}
