package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Agents lease over mutual TLS from a coordinator group that binds each
// holder to its certificate: an agent whose certificate names its -id
// decides on its leases; one whose certificate names another agent is
// refused every renewal (its leased rules fall to their failure policy),
// and says so at start-up.
func TestLeasedOverMutualTLS(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 1, leasedAgentRules, pki)
	good := startAgent(t, leasedAgentRules, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
		cfg.AgentID = "a1"
		cfg.TLS = pki.Agent("a1")
	})
	req := &rationv1.AllowRequest{Descriptors: map[string]string{"hot": "closed"}}
	for range 20 {
		if resp := good.allow(t, req); !resp.Allowed || resp.Reason != rationv1.Reason_REASON_OK {
			t.Fatalf("agent a1 with its own certificate: %v, want allowed on its lease", resp)
		}
	}
	if errs := metricValue(t, good.srv.Registry, "ration_agent_lease_renewals_total", map[string]string{"result": "error"}); errs != 0 {
		t.Fatalf("a1: %v renewals failed, want 0", errs)
	}

	impostor := startAgent(t, leasedAgentRules, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
		cfg.AgentID = "a1-impostor"
		cfg.TLS = pki.Agent("a2")
	})
	deadline := time.Now().Add(10 * time.Second)
	for metricValue(t, impostor.srv.Registry, "ration_agent_lease_renewals_total", map[string]string{"result": "error"}) == 0 {
		impostor.allow(t, req)
		if time.Now().After(deadline) {
			t.Fatal("the impostor's renewals never failed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if resp := impostor.allow(t, req); resp.Allowed {
		t.Fatalf("agent with another agent's certificate: %v, want fail_closed (no lease)", resp)
	}
	if ok := metricValue(t, impostor.srv.Registry, "ration_agent_lease_renewals_total", map[string]string{"result": "ok"}); ok != 0 {
		t.Fatalf("the impostor had %v renewals accepted, want 0", ok)
	}
}

// The agent decides on a Redis reached by rediss:// (client certificate
// required) as an ACL user, from its flags' settings.
func TestAgentOnRedisTLS(t *testing.T) {
	pki := harness.NewPKI(t)
	r := harness.StartRedis(t, harness.WithTLS(pki.Issue("redis"), true),
		harness.WithConfig("user ration on >s3cret ~ration:* &* +@all"))
	client := pki.Issue("agent")
	const yaml = `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 3
    rate: 0.001
`
	a := startAgentOn(t, "rediss://ration:s3cret@"+r.TLSAddr, yaml, func(cfg *agent.Config) {
		cfg.RedisTLS.CA, cfg.RedisTLS.Cert, cfg.RedisTLS.Key = client.CA, client.Cert, client.Key
	})
	req := &rationv1.AllowRequest{Descriptors: map[string]string{"user": "alice"}}
	for i := range 4 {
		resp := a.allow(t, req)
		if want := i < 3; resp.Allowed != want || resp.Reason == rationv1.Reason_REASON_UNAVAILABLE {
			t.Fatalf("decision %d over rediss://: %v, want allowed %v by the bucket", i+1, resp, want)
		}
	}
	if n, err := r.Client().Exists(context.Background(), "ration:{per-user|user=alice}").Result(); err != nil || n != 1 {
		t.Fatalf("bucket key in Redis: %v, %v; want it written over TLS", n, err)
	}
}
