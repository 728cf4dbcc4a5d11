// Package clienttest is a fake of the agent for the tests of code that uses
// package client: an Allower that decides in memory, with no agent and no
// network, and records what it was asked.
//
// Give code under test a client.Allower rather than a *client.Client (as
// client.Middleware does), and in its tests an Allower from this package:
//
//	fake := clienttest.New(clienttest.Bucket("per-user", 2, 1.0/3600, nil))
//	h := client.Middleware(fake, describe, client.MiddlewareOptions{})(handler)
//	// two requests of one user get 200, the third 429 with Retry-After
//
// Decisions come from a DecideFunc: Bucket (a token bucket per key, as the
// agent keeps for one rule), Fixed (any decision, such as a fail_closed
// 503), Unavailable (the agent unreachable), or one written for the test.
package clienttest

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ration-dev/ration/client"
)

// DecideFunc answers one request, as the agent would: a Decision, or an
// error wrapping client.ErrInvalid or client.ErrUnavailable.
type DecideFunc func(client.Request) (client.Decision, error)

// Allower is a client.Allower that answers from a DecideFunc and records
// every request it answers. It is safe for concurrent use; the zero value
// admits every request as matching no rule.
type Allower struct {
	mu       sync.Mutex
	decide   DecideFunc
	requests []client.Request
}

var _ client.Allower = (*Allower)(nil)

// New returns an Allower that answers with decide (nil: Admit()).
func New(decide DecideFunc) *Allower { return &Allower{decide: decide} }

// Allow answers req with the DecideFunc. A context already done gets the
// errors a Client returns then, and req is not recorded: a canceled one
// context.Canceled, an expired one client.ErrUnavailable wrapping
// context.DeadlineExceeded.
func (a *Allower) Allow(ctx context.Context, req client.Request) (client.Decision, error) {
	if err := ctx.Err(); err != nil {
		if err == context.Canceled {
			return client.Decision{}, fmt.Errorf("ration: %w", err)
		}
		return client.Decision{}, fmt.Errorf("%w: %w", client.ErrUnavailable, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.requests = append(a.requests, req)
	if a.decide == nil {
		return Admit()(req)
	}
	return a.decide(req)
}

// SetDecide changes how later requests are answered: the agent going down
// in the middle of a test, say.
func (a *Allower) SetDecide(decide DecideFunc) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.decide = decide
}

// Requests returns the requests answered so far, oldest first.
func (a *Allower) Requests() []client.Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.requests)
}

// Admit admits every request as matching no rule (client.ReasonNoRule), as
// an agent whose rules do not cover the request does.
func Admit() DecideFunc {
	return func(client.Request) (client.Decision, error) {
		return client.Decision{Allowed: true, Reason: client.ReasonNoRule}, nil
	}
}

// Fixed answers every request with d: a denial, or an agent whose store is
// down under a fail_closed rule (Reason client.ReasonUnavailable, not
// Allowed: Status 503).
func Fixed(d client.Decision) DecideFunc {
	return func(client.Request) (client.Decision, error) { return d, nil }
}

// Unavailable fails every request as a Client does when the agent cannot be
// reached: an error wrapping client.ErrUnavailable.
func Unavailable() DecideFunc {
	return func(client.Request) (client.Decision, error) {
		return client.Decision{}, fmt.Errorf("%w: clienttest: the agent is down", client.ErrUnavailable)
	}
}

// Bucket decides as the agent does for one rule of the given burst and rate
// (tokens per second; 0 for a fixed allowance) that every request matches:
// one token bucket per key, full at first. A request's key is its Subject
// when it names the rule, else its descriptors. It answers client.ErrInvalid
// for a cost that can never be admitted (negative, or above burst) and for
// a request naming another rule. now is the clock (nil: time.Now); a test
// that moves its own clock sees the buckets refill.
//
// The agent's answers are the reference: for the same rule and requests
// Bucket gives the fields a real agent gives (the root module's
// test/goclient checks it against one). Unlike the agent, which knows the
// rule's match block, it keys a descriptors request by all of its
// descriptors, and keeps descriptors and rule-and-subject requests in
// separate buckets.
func Bucket(rule string, burst int64, rate float64, now func() time.Time) DecideFunc {
	if now == nil {
		now = time.Now
	}
	type state struct {
		tokens float64
		at     time.Time
	}
	var mu sync.Mutex
	buckets := map[string]*state{}
	return func(req client.Request) (client.Decision, error) {
		if req.Rule != "" && req.Rule != rule {
			return client.Decision{}, fmt.Errorf("%w: clienttest: unknown rule %q", client.ErrInvalid, req.Rule)
		}
		cost := req.Cost
		if cost == 0 {
			cost = 1
		}
		if !(cost > 0) || cost > float64(burst) {
			return client.Decision{}, fmt.Errorf("%w: clienttest: cost %v must be positive and at most burst %d", client.ErrInvalid, req.Cost, burst)
		}
		mu.Lock()
		defer mu.Unlock()
		t := now()
		key := keyOf(req)
		b := buckets[key]
		if b == nil {
			b = &state{tokens: float64(burst), at: t}
			buckets[key] = b
		}
		if el := t.Sub(b.at); el > 0 {
			b.tokens = math.Min(float64(burst), b.tokens+el.Seconds()*rate)
		}
		b.at = t
		d := client.Decision{Rule: rule, Limit: burst, Rate: rate, Reason: client.ReasonOK}
		if b.tokens >= cost {
			b.tokens -= cost
			d.Allowed = true
		} else {
			d.Reason = client.ReasonOverLimit
			d.RetryAfter = wait(cost-b.tokens, rate)
		}
		d.Remaining = int64(math.Floor(b.tokens))
		d.Reset = wait(float64(burst)-b.tokens, rate)
		return d, nil
	}
}

// wait is how long rate takes to refill need tokens, rounded up to the
// millisecond as the agent's answers are; 0 when it never does.
func wait(need, rate float64) time.Duration {
	if need <= 0 || rate <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(need/rate*1000)) * time.Millisecond
}

// keyOf is the bucket a request charges: its subject, or its descriptors
// in key order.
func keyOf(req client.Request) string {
	if req.Rule != "" {
		return "subject\x00" + req.Subject
	}
	keys := make([]string, 0, len(req.Descriptors))
	for k := range req.Descriptors {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString("descriptors")
	for _, k := range keys {
		b.WriteString("\x00" + k + "\x00" + req.Descriptors[k])
	}
	return b.String()
}
