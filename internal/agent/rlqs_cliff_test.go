package agent_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

const cliffRules = `
rules:
  - name: tenant
    match: {tenant: "*"}
    burst: 10
    rate: 5
    mode: leased
    lease: {period: 2s}
`

// Forty Envoy streams on one agent, each with a bucket of its own (one
// per user) under one tenant's limit of 5/s: each bucket's share of the
// lease's rate is about 0.11/s. Rounded down to whole tokens per second,
// every share was 0 and every bucket was denied everything while the
// agent kept the tenant's lease (0 admitted). Shares under 1/s are sent
// as a token every few seconds, a few buckets at a time in turns, and an
// unchanged assignment is carried on, not charged again: the tenant
// admits most of its budget, spread over many of its buckets.
func TestRLQSManyBucketsOfOneSubject(t *testing.T) {
	const (
		streams = 40
		run     = 20 * time.Second
		quota   = "tenant|tenant=acme"
	)
	c := harness.StartCoordinators(t, 1, cliffRules)
	a := startAgent(t, cliffRules, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
	})
	rec := admission.NewRecorder()
	admitted := make([]int, streams)
	var wg sync.WaitGroup
	end := time.Now().Add(run)
	for i := range streams {
		cl := harness.DialRLQS(t, a.srv.GRPCAddr(), "edge", time.Second, func() { rec.Admit(fmt.Sprint("envoy-", i), quota, 1) })
		cl.OnDeny(func() { rec.Deny(fmt.Sprint("envoy-", i), quota, 1) })
		id := map[string]string{"tenant": "acme", "user": fmt.Sprint("u", i)}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 2000 && time.Now().Before(end); n++ {
				if cl.Request(id) {
					admitted[i]++
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err := cl.Err(); err != nil {
				t.Errorf("envoy-%d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	rep := admission.Check(rec.Records(), quota, 10, 5)
	least, most, served := admitted[0], admitted[0], 0
	for _, n := range admitted {
		least, most = min(least, n), max(most, n)
		if n > 0 {
			served++
		}
	}
	t.Logf("%d buckets of one subject: admitted %v (each %d to %d, %d buckets served); overshoot %.2f, utilisation %.3f; false refusals %d of %d",
		streams, rep.Admitted, least, most, served, rep.Overshoot, rep.Utilisation, rep.Refusals.False, rep.Refusals.Refused)
	if rep.Overshoot > 1e-9 {
		t.Fatalf("admissions overshoot B + r*T by %.2f tokens (window %v..%v)", rep.Overshoot, rep.From, rep.To)
	}
	// Measured 0.67-0.89, and 30-34 of the 40 buckets served (22-24
	// under -race: a loan is reconsidered only when its assignment is
	// renewed, so turns are coarse). The floors are far above the cliff
	// (nothing) and below the noise.
	if rep.Utilisation < 0.6 {
		t.Errorf("utilisation %.3f: the subject's %d greedy buckets got under 0.6 of its budget", rep.Utilisation, streams)
	}
	if served < streams/3 {
		t.Errorf("%d of %d buckets with demand admitted something in %v: the others' shares were never funded", served, streams, run)
	}
}

const budgetRules = `
rules:
  - name: hot
    match: {hot: "*"}
    burst: 50
    rate: 20
    mode: leased
    lease: {period: 2s}
`

// Two agents, three greedy Envoys on each (Envoy's filter semantics,
// reports every second) on one leased subject: the Envoys together admit
// most of the subject's budget (all but the tenth of each lease's rate
// kept back for new buckets). Each assignment was charged its whole max_tokens on
// every re-send, although Envoy carries an unchanged bucket on (0.45 of
// the budget).
func TestRLQSGreedyEnvoysReachTheBudget(t *testing.T) {
	const (
		run   = 20 * time.Second
		quota = "hot|hot=a"
	)
	c := harness.StartCoordinators(t, 1, budgetRules)
	rec := admission.NewRecorder()
	var clients []*harness.RLQSClient
	for i := range 2 {
		a := startAgent(t, budgetRules, func(cfg *agent.Config) {
			cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
		})
		for j := range 3 {
			name := fmt.Sprintf("envoy-%d-%d", i, j)
			cl := harness.DialRLQS(t, a.srv.GRPCAddr(), "edge", time.Second, func() { rec.Admit(name, quota, 1) })
			cl.OnDeny(func() { rec.Deny(name, quota, 1) })
			clients = append(clients, cl)
		}
	}
	driveRLQS(t, clients, map[string]string{"hot": "a"}, run)
	rep := admission.Check(rec.Records(), quota, 50, 20)
	// False refusals (denied while an exact bucket held a token) are the
	// other side of the utilisation below: logged, the floor judges them.
	t.Logf("admitted %v; overshoot %.2f, utilisation %.3f; false refusals %d of %d", rep.Admitted, rep.Overshoot, rep.Utilisation, rep.Refusals.False, rep.Refusals.Refused)
	if rep.Overshoot > 1e-9 {
		t.Fatalf("admissions overshoot B + r*T by %.2f tokens (window %v..%v)", rep.Overshoot, rep.From, rep.To)
	}
	// Measured 0.79-0.81: a tenth of each lease's rate is held back
	// (rlqs reserve) and the leases settle in the first seconds.
	if rep.Utilisation < 0.65 {
		t.Errorf("utilisation %.3f: greedy Envoys got under 0.65 of the budget", rep.Utilisation)
	}
	// How long each agent's Envoys went without an admission, once the
	// leases settled: 0.23-0.34 s measured; a lease lost for a misread
	// demand left one agent's at 0 for 2.3 s and more. Logged, not
	// asserted (a wall-clock bound): TestDemandOfLumpyCounts
	// (internal/holder) judges the cause.
	for i := range 2 {
		gap, at := longestGap(rec.Records(), fmt.Sprintf("envoy-%d-", i), settle, run)
		t.Logf("agent %d: longest gap between admissions %v, from %v", i, gap, at)
	}
}

// settle is how long leases take to split between agents at the start.
const settle = 3 * time.Second

// longestGap is the longest time in [from, to] with no admission recorded
// by an agent whose name starts with prefix, and when it began.
func longestGap(recs []admission.Record, prefix string, from, to time.Duration) (gap, at time.Duration) {
	last := from
	for _, r := range recs {
		if !r.Allowed || !strings.HasPrefix(r.Agent, prefix) || r.At < from {
			continue
		}
		if r.At-last > gap {
			gap, at = r.At-last, last
		}
		last = r.At
	}
	if to-last > gap {
		gap, at = to-last, last
	}
	return gap, at
}

// Envoys on RLQS and callers of Allow on one agent share one lease: what
// the lease lends an assignment (its max_tokens, its refill) is taken out
// of the balance the agent's own decisions spend, so that together they
// stay within B + r*T. Lent without being taken, Allow spent the tokens
// the Envoys held.
func TestRLQSAndAllowShareOneLease(t *testing.T) {
	const (
		run   = 8 * time.Second
		quota = "hot|hot=a"
	)
	c := harness.StartCoordinators(t, 1, budgetRules)
	a := startAgent(t, budgetRules, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
	})
	rec := admission.NewRecorder()
	var clients []*harness.RLQSClient
	for j := range 3 {
		name := fmt.Sprint("envoy-", j)
		clients = append(clients, harness.DialRLQS(t, a.srv.GRPCAddr(), "edge", time.Second, func() { rec.Admit(name, quota, 1) }))
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		end := time.Now().Add(run)
		for n := 0; n < 20000 && time.Now().Before(end); n++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			r, err := a.rl.Allow(ctx, &rationv1.AllowRequest{Descriptors: map[string]string{"hot": "a"}})
			cancel()
			if err == nil && r.Allowed {
				rec.Admit("allow", quota, 1)
			}
			time.Sleep(50 * time.Millisecond) // a steady caller beside greedy Envoys
		}
	}()
	driveRLQS(t, clients, map[string]string{"hot": "a"}, run)
	wg.Wait()
	rep := admission.Check(rec.Records(), quota, 50, 20)
	t.Logf("admitted %v (Envoys and Allow); overshoot %.2f, utilisation %.3f", rep.Admitted, rep.Overshoot, rep.Utilisation)
	// The recorder stamps an Allow admission when its answer arrives, a
	// little after the charge: a token's worth of slack absorbs that.
	if rep.Overshoot > 1 {
		t.Fatalf("Envoys and Allow together overshoot B + r*T by %.2f tokens (window %v..%v)", rep.Overshoot, rep.From, rep.To)
	}
}
