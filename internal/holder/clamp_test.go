package holder_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// A coordinator that grants more than the agent's rule allows (one of
// another group, a never-member's group of its own, or one running other
// rules) cannot make the agent admit past its rule: every grant is held
// to the rule's burst and rate, and the clamp is counted. A rogue group
// served 300 of 300 on a rule of burst 50.
func TestGrantHeldToTheRule(t *testing.T) {
	const coordinators = `
rules:
  - name: r
    match: {user: "*"}
    burst: 1000
    rate: 500
    mode: leased
    lease: {period: 1s}
`
	const agents = `
rules:
  - name: r
    match: {user: "*"}
    burst: 50
    rate: 20
    mode: leased
    lease: {period: 1s}
`
	c := harness.StartCoordinators(t, 1, coordinators)
	r := rule(t, agents, "r")
	reg := prometheus.NewRegistry()
	h, _ := runHolder(t, c, holder.Options{Holder: "a", Registry: reg})
	ctx := context.Background()
	admitted := 0
	first := h.Now()
	var last int64
	for range 300 {
		last = h.Now()
		res, ok := h.Take(ctx, r, "user=x", 1, last)
		if ok && res.Allowed {
			admitted++
		}
	}
	// What the rule allows over the decisions' span, on the holder's own
	// clock: its burst, and its rate for the span.
	allowed := r.Burst + r.Rate*float64(last-first)/1e6
	if float64(admitted) > allowed+1 {
		t.Errorf("%d of 300 admitted in %.3fs, the rule allows %.1f (burst %v, rate %v/s): a grant past the rule was spent",
			admitted, float64(last-first)/1e6, allowed, r.Burst, r.Rate)
	}
	if admitted == 0 {
		t.Errorf("nothing admitted: the clamped lease should still pay the rule's burst")
	}
	// Over several renewals, from a coordinator running its own code: it
	// answers every renewal with a full balance, which the cap alone does
	// not bound. Deposits are held to a bucket of the rule's shape, and
	// the lease refills at most at the rule's rate: at most B + 2·r·T.
	rogue, _ := runHolderVia(t, c, holder.Options{Holder: "b", Registry: prometheus.NewRegistry()},
		func(cl *coordinator.Client) holder.Client { return toppingUp{cl} })
	admitted, first = 0, rogue.Now()
	for i := 0; i < 2000 && last-first < 3e6; i++ {
		last = rogue.Now()
		if res, ok := rogue.Take(ctx, r, "user=x", 1, last); ok && res.Allowed {
			admitted++
		}
		time.Sleep(time.Millisecond)
	}
	span := float64(last-first) / 1e6
	t.Logf("%d admitted in %.3fs of top-ups (rule: burst %v, rate %v/s)", admitted, span, r.Burst, r.Rate)
	if bound := r.Burst + 2*r.Rate*span; float64(admitted) > bound+1 {
		t.Errorf("%d admitted in %.3fs of top-ups, at most B + 2rT = %.1f allowed: deposits past the rule were spent", admitted, span, bound)
	}
	if v := gatheredCounter(t, reg, "ration_agent_lease_grants_clamped_total"); v < 1 {
		t.Errorf("ration_agent_lease_grants_clamped_total %v, want at least 1", v)
	}
}

func gatheredCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return -1
}

// toppingUp is a coordinator that answers every renewal with a full
// balance of a huge lease.
type toppingUp struct{ *coordinator.Client }

func (c toppingUp) Renew(ctx context.Context, req *rationv1.RenewRequest) (*rationv1.RenewResponse, error) {
	resp, err := c.Client.Renew(ctx, req)
	for _, g := range resp.GetGrants() {
		if g.GetError() == "" {
			g.Balance, g.Cap, g.Rate = 1e6, 1e6, 1e6
		}
	}
	return resp, err
}
