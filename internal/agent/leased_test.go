package agent_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

const leasedAgentRules = `
rules:
  - name: hot-closed
    match: {hot: closed}
    burst: 1000
    rate: 1000
    mode: leased
    lease: {period: 1s}
  - name: hot-emergency
    match: {hot: emergency}
    burst: 1000
    rate: 1000
    mode: leased
    lease: {period: 1s}
    on_failure: emergency
    emergency: {burst: 3, rate: 0, max_duration: 1m}
`

// Leased rules through the agent's gRPC API against a real 3-node
// coordinator group: decided locally while the lease lives; once every
// coordinator is gone and the lease has expired, each rule's failure policy
// decides (503 for fail_closed, the local emergency bucket for emergency).
func TestLeasedRulesThroughAgent(t *testing.T) {
	c := harness.StartCoordinators(t, 3, leasedAgentRules)
	a := startAgent(t, leasedAgentRules, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
	})
	for _, v := range []string{"closed", "emergency"} {
		resp := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"hot": v}})
		if !resp.Allowed || resp.Reason != rationv1.Reason_REASON_OK {
			t.Fatalf("leased %s with live coordinators = %v, want ok", v, resp)
		}
	}
	if got := metricValue(t, a.srv.Registry, "ration_decisions_total",
		map[string]string{"rule": "hot-closed", "path": "leased", "result": "allowed", "reason": "ok"}); got != 1 {
		t.Fatalf("leased decisions counted = %v, want 1 on path leased", got)
	}
	// Redis holds nothing for leased rules: no network hop per request.
	if n := a.dbsize(t); n != 0 {
		t.Fatalf("Redis has %d keys after leased decisions only, want 0", n)
	}

	for i := 0; i < c.N(); i++ {
		c.Kill(i)
	}
	// The lease lives at most one period (1s) past its last renewal.
	waitFor(t, "the lease to expire", func() bool {
		resp := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"hot": "closed"}})
		return resp.Reason == rationv1.Reason_REASON_UNAVAILABLE
	})
	resp := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"hot": "closed"}})
	if resp.Allowed || agent.CheckStatus(agentResponse(resp)) != 503 {
		t.Fatalf("fail_closed leased rule after expiry = %v, want denied with 503", resp)
	}
	var admitted int
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < 10 && time.Now().Before(deadline); i++ {
		resp := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"hot": "emergency"}})
		if resp.Reason == rationv1.Reason_REASON_OK {
			i-- // still on the live lease; wait for it to lapse
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if resp.Reason != rationv1.Reason_REASON_EMERGENCY {
			t.Fatalf("emergency leased rule after expiry = %v, want reason emergency", resp)
		}
		if resp.Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("emergency admitted %d of 10 after the lease expired, want its burst 3", admitted)
	}
}

func agentResponse(r *rationv1.AllowResponse) agent.Response {
	reasons := map[rationv1.Reason]agent.Reason{
		rationv1.Reason_REASON_OK: agent.ReasonOK, rationv1.Reason_REASON_OVER_LIMIT: agent.ReasonOverLimit,
		rationv1.Reason_REASON_UNAVAILABLE: agent.ReasonUnavailable, rationv1.Reason_REASON_EMERGENCY: agent.ReasonEmergency,
	}
	return agent.Response{Allowed: r.Allowed, Reason: reasons[r.Reason]}
}
