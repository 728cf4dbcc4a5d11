package agent_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
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

	impostor := startAgentUnready(t, leasedAgentRules, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
		cfg.AgentID = "a1-impostor"
		cfg.TLS = pki.Agent("a2")
	})
	// It never turns ready (its leased rules could only answer 503), and
	// says why.
	waitFor(t, "the impostor to name its certificate's problem", func() bool {
		return strings.Contains(impostor.srv.NotReady(), "a1-impostor")
	})
	if impostor.srv.Ready() {
		t.Fatal("the impostor turned ready")
	}
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

// -listen-tls with -listen-client-auth: a gateway with a gateway's
// certificate of the CA gets decisions over gRPC and HTTPS; one with
// another certificate of the CA (an agent's, a coordinator's, an
// operator's), without one, or in plaintext, gets none. -metrics moves /metrics (and the probes) to a plaintext
// listener of its own.
func TestAgentListenersTLS(t *testing.T) {
	pki := harness.NewPKI(t)
	const yaml = `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 100
    rate: 1
`
	a := startAgent(t, yaml, func(cfg *agent.Config) {
		cfg.TLS = pki.Issue("agent-a1", "ration://agent/a1")
		cfg.AgentID = "a1"
		cfg.ListenTLS, cfg.ListenClientAuth = true, true
		cfg.MetricsAddr = "127.0.0.1:0"
	})
	gw := pki.Source(pki.Gateway("gw-1"))
	ctx := context.Background()
	req := &rationv1.AllowRequest{Descriptors: map[string]string{"user": "alice"}}

	cc, err := grpc.NewClient(a.srv.GRPCAddr(), grpc.WithTransportCredentials(gw.ClientCredentials("", nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if resp, err := rationv1.NewRateLimiterClient(cc).Allow(ctx, req); err != nil || !resp.Allowed {
		t.Fatalf("gRPC Allow with a gateway certificate: %v, %v; want allowed", resp, err)
	}
	// The fleet's other certificates are of the same CA, and no gateway's:
	// refused at the handshake, over gRPC and HTTPS.
	for _, tc := range []struct {
		name string
		f    tlsfiles.Files
	}{
		{"an agent's", pki.Agent("a2")},
		{"a coordinator's", pki.Member(tlsfiles.GlobalGroup, "n1")},
		{"an operator's", pki.Operator("ops")},
		{"one naming no identity", pki.Issue("no-identity")},
		{"a gateway's with user information", pki.Issue("odd-gateway", "ration://agent@gateway/gw")},
	} {
		src := pki.Source(tc.f)
		other, err := grpc.NewClient(a.srv.GRPCAddr(), grpc.WithTransportCredentials(src.ClientCredentials("", nil)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rationv1.NewRateLimiterClient(other).Allow(ctx, req); err == nil {
			t.Errorf("gRPC Allow with %s certificate succeeded, want refused (not a gateway)", tc.name)
		}
		other.Close()
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: src.ClientConfig("127.0.0.1", nil)}}
		if resp, err := c.Get("https://" + a.srv.HTTPAddr() + "/v1/check?user=alice"); err == nil {
			resp.Body.Close()
			t.Errorf("HTTPS /v1/check with %s certificate = %d, want refused (not a gateway)", tc.name, resp.StatusCode)
		}
	}
	// Verifies the agent's certificate, presents none.
	noCert := &tls.Config{RootCAs: x509.NewCertPool()}
	noCert.RootCAs.AppendCertsFromPEM(pki.CA.CertPEM)
	cc2, err := grpc.NewClient(a.srv.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(noCert)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc2.Close()
	if _, err := rationv1.NewRateLimiterClient(cc2).Allow(ctx, req); err == nil {
		t.Fatal("gRPC Allow without a client certificate succeeded")
	}
	if _, err := a.rl.Allow(ctx, req); err == nil {
		t.Fatal("plaintext gRPC Allow against -listen-tls succeeded")
	}

	https := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: gw.ClientConfig("127.0.0.1", nil)}}
	resp, err := https.Get("https://" + a.srv.HTTPAddr() + "/v1/check?user=alice")
	if err != nil {
		t.Fatalf("HTTPS /v1/check with a gateway certificate: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTPS /v1/check = %d, want 200", resp.StatusCode)
	}
	bare := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: noCert}}
	if resp, err := bare.Get("https://" + a.srv.HTTPAddr() + "/v1/check?user=alice"); err == nil {
		resp.Body.Close()
		t.Fatalf("HTTPS /v1/check without a client certificate = %d, want refused", resp.StatusCode)
	}
	if resp, err := http.Get("http://" + a.srv.HTTPAddr() + "/v1/check?user=alice"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plaintext HTTP /v1/check against -listen-tls answered 200")
		}
	}

	// /metrics on -metrics, in plaintext; no longer on -http.
	m, err := http.Get("http://" + a.srv.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(m.Body)
	m.Body.Close()
	if m.StatusCode != http.StatusOK || !strings.Contains(string(body), "ration_") {
		t.Fatalf("-metrics /metrics = %d, want 200 with ration_ series", m.StatusCode)
	}
	if r, err := http.Get("http://" + a.srv.MetricsAddr() + "/readyz"); err != nil || r.StatusCode != http.StatusOK {
		t.Fatalf("-metrics /readyz: %v, %v", r, err)
	} else {
		r.Body.Close()
	}
	resp, err = https.Get("https://" + a.srv.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/metrics on -http with -metrics set = %d, want 404", resp.StatusCode)
	}
}

// An agent leases only from a server whose certificate names a
// coordinator of its group (its -region's, or the global group): a server
// holding another certificate of the same CA (an agent's, an operator's,
// another region's coordinator's) is dialed, fails the agent's check at the
// handshake and receives no renewal, so it cannot hand the agent a lease;
// the agent's leased rules fall to their failure policy.
func TestAgentLeasesOnlyFromACoordinator(t *testing.T) {
	pki := harness.NewPKI(t)
	for _, tc := range []struct {
		name string
		f    tlsfiles.Files
	}{
		{"an agent's", pki.Agent("a2")},
		{"an operator's", pki.Operator("ops")},
		{"another region's coordinator's", pki.Member("us", "u1", tlsfiles.URI(tlsfiles.RoleRegion, "us"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rogue := harness.StartRogue(t, pki, tc.f)
			a := startAgentUnready(t, leasedAgentRules, func(cfg *agent.Config) {
				cfg.Coordinators = rogue.Addr
				cfg.Region = "eu"
				cfg.AgentID = "a1"
				cfg.TLS = pki.Agent("a1")
			})
			req := &rationv1.AllowRequest{Descriptors: map[string]string{"hot": "closed"}}
			deadline := time.Now().Add(30 * time.Second)
			for rogue.Conns() < 2 && len(rogue.Calls()) == 0 {
				a.allow(t, req)
				if time.Now().After(deadline) {
					t.Fatalf("the agent dialed the rogue %d times in 30s", rogue.Conns())
				}
				time.Sleep(20 * time.Millisecond)
			}
			if calls := rogue.Calls(); len(calls) != 0 {
				t.Fatalf("the rogue coordinator received calls %q", calls)
			}
			if resp := a.allow(t, req); resp.Allowed {
				t.Fatalf("decision without a coordinator: %v, want fail_closed", resp)
			}
		})
	}
}
