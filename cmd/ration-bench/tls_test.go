package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/certgen"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

// testPKI is a CA in a temporary directory with the agent's certificate
// (agent.crt), a gateway's (gateway.crt) and the CA bundle (ca.crt), and a
// second CA's bundle (other/ca.crt) that signed none of them.
type testPKI struct {
	dir   string
	other string
}

func newTestPKI(t testing.TB) testPKI {
	t.Helper()
	dir := t.TempDir()
	ca, err := certgen.NewCA("ration-bench test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	req := func(name string, uris ...string) certgen.Request {
		return certgen.Request{CommonName: name, URIs: uris, DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}
	}
	if _, err := ca.WriteFiles(dir, "agent", req("agent", tlsfiles.URI(tlsfiles.RoleAgent, "bench"))); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.WriteFiles(dir, "gateway", req("gateway", tlsfiles.URI(tlsfiles.RoleGateway, "bench"))); err != nil {
		t.Fatal(err)
	}
	other, err := certgen.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// Its own directory: WriteFiles writes the bundle as ca.crt.
	o, err := other.WriteFiles(t.TempDir(), "x", req("x"))
	if err != nil {
		t.Fatal(err)
	}
	return testPKI{dir: dir, other: o.CA}
}

func (p testPKI) file(name string) string { return filepath.Join(p.dir, name) }

func (p testPKI) agentFiles() tlsfiles.Files {
	return tlsfiles.Files{Cert: p.file("agent.crt"), Key: p.file("agent.key"), CA: p.file("ca.crt")}
}

func TestParseFlagsTLS(t *testing.T) {
	p := newTestPKI(t)
	cfg, err := parseFlags([]string{"-tls-ca", p.file("ca.crt"), "-tls-cert", p.file("gateway.crt"), "-tls-key", p.file("gateway.key"),
		"-tls-server-name", "localhost"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c := cfg.tlsConfig; c == nil || c.RootCAs == nil || len(c.Certificates) != 1 || c.ServerName != "localhost" {
		t.Errorf("tlsConfig = %+v, want the CA, one client certificate and server name localhost", c)
	}
	cfg, err = parseFlags([]string{"-mode", "http", "-tls-ca", p.file("ca.crt")}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c := cfg.tlsConfig; c == nil || len(c.Certificates) != 0 || cfg.TLS.scheme() != "https" {
		t.Errorf("-tls-ca alone: tlsConfig %+v, scheme %s; want no client certificate, https", c, cfg.TLS.scheme())
	}
	if cfg, err := parseFlags(nil, &bytes.Buffer{}); err != nil || cfg.tlsConfig != nil || cfg.TLS.scheme() != "http" {
		t.Errorf("no -tls-*: %v, tlsConfig %v, scheme %s; want plaintext", err, cfg.tlsConfig, cfg.TLS.scheme())
	}

	missing := filepath.Join(p.dir, "missing.crt")
	for _, c := range []struct {
		args []string
		want []string // every problem is reported, not only the first
	}{
		{[]string{"-tls-cert", p.file("gateway.crt")}, []string{"-tls-key", "need -tls-ca"}},
		{[]string{"-tls-ca", p.file("ca.crt"), "-tls-key", p.file("gateway.key")}, []string{"give both"}},
		{[]string{"-tls-server-name", "localhost"}, []string{"-tls-server-name needs -tls-ca"}},
		{[]string{"-tls-ca", missing}, []string{"-tls-ca", missing, "no such file"}},
		{[]string{"-tls-ca", p.file("gateway.key")}, []string{"-tls-ca " + p.file("gateway.key"), "no PEM certificate"}},
		// The key of another certificate.
		{[]string{"-tls-ca", p.file("ca.crt"), "-tls-cert", p.file("gateway.crt"), "-tls-key", p.file("agent.key")},
			[]string{"-tls-cert " + p.file("gateway.crt"), "-tls-key " + p.file("agent.key"), "does not match"}},
		{[]string{"-tls-ca", missing, "-tls-cert", missing, "-tls-key", p.file("gateway.key")},
			[]string{"-tls-ca: open " + missing, "-tls-cert " + missing}},
	} {
		_, err := parseFlags(c.args, &bytes.Buffer{})
		if err == nil {
			t.Errorf("parseFlags(%q) succeeded, want an error", c.args)
			continue
		}
		if !errors.Is(err, errUsage) || exitCode(err) != 2 {
			t.Errorf("parseFlags(%q) = %v: want a usage error (exit 2)", c.args, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("parseFlags(%q) = %q, want it to mention %q", c.args, err, w)
			}
		}
	}
}

// runJSON runs ration-bench with args and decodes its report.
func runJSON(t *testing.T, args ...string) (Report, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), args, &stdout, &stderr)
	var r Report
	if err == nil {
		if jerr := json.Unmarshal(stdout.Bytes(), &r); jerr != nil {
			t.Fatalf("report is not JSON: %v\n%s", jerr, stdout.String())
		}
	}
	return r, err
}

// An agent with -listen-tls is measured over TLS (gRPC and HTTPS) with
// -tls-ca; one with -listen-client-auth also needs -tls-cert and -tls-key.
// A mismatch fails before any load, saying what to check.
func TestRunAgainstTLSAgent(t *testing.T) {
	p := newTestPKI(t)
	tlsAgent := startAgent(t, func(c *agent.Config) {
		c.TLS, c.AgentID, c.ListenTLS = p.agentFiles(), "bench", true
	})
	mtlsAgent := startAgent(t, func(c *agent.Config) {
		c.TLS, c.AgentID, c.ListenTLS, c.ListenClientAuth = p.agentFiles(), "bench", true, true
	})
	short := []string{"-duration", "200ms", "-warmup", "50ms", "-concurrency", "4", "-keys", "20", "-json"}
	ca := []string{"-tls-ca", p.file("ca.crt")}
	gw := append([]string{"-tls-cert", p.file("gateway.crt"), "-tls-key", p.file("gateway.key")}, ca...)
	for _, c := range []struct {
		name   string
		args   []string
		client bool // a client certificate was presented
	}{
		{"tls empty", append([]string{"-mode", "empty", "-target", tlsAgent.GRPCAddr()}, ca...), false},
		{"tls allow", append([]string{"-mode", "allow", "-target", tlsAgent.GRPCAddr()}, ca...), false},
		{"tls allow by name", append([]string{"-mode", "allow", "-target", "localhost:" + port(tlsAgent.GRPCAddr())}, ca...), false},
		{"tls server name", append([]string{"-mode", "allow", "-target", tlsAgent.GRPCAddr(), "-tls-server-name", "localhost"}, ca...), false},
		{"tls http", append([]string{"-mode", "http", "-http-target", tlsAgent.HTTPAddr()}, ca...), false},
		{"mtls allow", append([]string{"-mode", "allow", "-target", mtlsAgent.GRPCAddr()}, gw...), true},
		{"mtls stream", append([]string{"-mode", "stream", "-target", mtlsAgent.GRPCAddr()}, gw...), true},
		{"mtls http", append([]string{"-mode", "http", "-http-target", mtlsAgent.HTTPAddr()}, gw...), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := runJSON(t, append(c.args, short...)...)
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			checkCounts(t, r)
			if r.Errors != 0 {
				t.Errorf("%d errors: %v", r.Errors, r.ErrorsByReason)
			}
			if !strings.HasPrefix(r.TLS, "TLS 1.") || strings.Contains(r.TLS, "client certificate") != c.client {
				t.Errorf("report tls = %q, want the TLS version negotiated, client certificate %v", r.TLS, c.client)
			}
		})
	}

	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"plaintext to tls", []string{"-mode", "allow", "-target", tlsAgent.GRPCAddr()}, []string{"One started with -listen-tls needs -tls-ca"}},
		{"plaintext http to tls", []string{"-mode", "http", "-http-target", tlsAgent.HTTPAddr()}, []string{"needs -tls-ca"}},
		{"no client cert to mtls", append([]string{"-mode", "allow", "-target", mtlsAgent.GRPCAddr()}, ca...), []string{"also needs -tls-cert and -tls-key"}},
		{"no client cert to mtls http", append([]string{"-mode", "http", "-http-target", mtlsAgent.HTTPAddr()}, ca...), []string{"also needs -tls-cert and -tls-key"}},
		{"another CA", []string{"-mode", "allow", "-target", tlsAgent.GRPCAddr(), "-tls-ca", p.other}, []string{"certificate signed by unknown authority"}},
		{"wrong name", append([]string{"-mode", "allow", "-target", tlsAgent.GRPCAddr(), "-tls-server-name", "agent.example"}, ca...), []string{"agent.example"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := runJSON(t, append(c.args, short...)...)
			if !errors.Is(err, errUnreachable) || exitCode(err) != 1 {
				t.Fatalf("run = %v, want unreachable (exit 1)", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func port(hostport string) string {
	_, p, _ := net.SplitHostPort(hostport)
	return p
}
