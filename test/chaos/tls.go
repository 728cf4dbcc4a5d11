package chaos

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ration-dev/ration/internal/certgen"
	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Every scenario runs with mutual TLS on every coordinator link, as a
// production deployment does: agents, coordinators (Raft, leases, the
// upstream group, admin) and the test's own clients present certificates
// of one CA made for the run (chaosCA), each naming the identity it acts
// as (docs/security.md). So every fault a scenario injects meets the
// secure path, reconnects and handshakes included.
var chaosCA *certgen.CA

func newChaosCA() error {
	ca, err := certgen.NewCA("ration chaos CA", 24*time.Hour)
	if err != nil {
		return fmt.Errorf("chaos CA: %w", err)
	}
	chaosCA = ca
	return nil
}

// pkiOf issues certificates of the run's CA into t's temporary directory.
func pkiOf(t testing.TB) *harness.PKI {
	t.Helper()
	return harness.NewPKIWithCA(t, chaosCA)
}

// startCoordinators is harness.StartCoordinatorsTLS with the run's CA: an
// in-process group whose nodes hold coordinator (and region)
// certificates.
func startCoordinators(t testing.TB, n int, rulesYAML string, opts ...func(*coordinator.Config)) *harness.Coordinators {
	t.Helper()
	return harness.StartCoordinatorsTLS(t, n, rulesYAML, pkiOf(t), opts...)
}

// tlsFlags are the -tls-* flags of a process holding files.
func tlsFlags(f tlsfiles.Files) []string {
	return []string{"-tls-cert", f.Cert, "-tls-key", f.Key, "-tls-ca", f.CA}
}

// identity is a certificate of the run's CA naming uris, kept in memory:
// what the test's own clients and gRPC proxies present.
func identity(uris ...string) (tls.Certificate, error) {
	certPEM, keyPEM, err := chaosCA.Issue(certgen.Request{
		CommonName: strings.Join(uris, ","), URIs: uris,
		DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
	})
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

func caPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(chaosCA.Cert)
	return p
}

// dialAs are the dial options of a client that acts as uris (e.g. an
// operator for the admin API).
func dialAs(t testing.TB, uris ...string) grpc.DialOption {
	t.Helper()
	cert, err := identity(uris...)
	if err != nil {
		t.Fatalf("chaos: %v", err)
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12, RootCAs: caPool(), Certificates: []tls.Certificate{cert},
	}))
}

// asOperator dials the admin API as an operator.
func asOperator(t testing.TB) grpc.DialOption {
	return dialAs(t, tlsfiles.URI(tlsfiles.RoleOperator, "chaos"))
}

// proxyServerCreds are a gRPC proxy's server side: a coordinator's
// certificate of the CA (its clients, agents and a regional group's
// upstream loop, talk only to a coordinator, of the global group for the
// latter), and a client certificate of the CA required, whose identities
// the proxy then acts under upstream (passThrough).
func proxyServerCreds(t testing.TB) grpc.ServerOption {
	t.Helper()
	cert, err := identity(tlsfiles.CoordinatorURI("global", "chaos-proxy"))
	if err != nil {
		t.Fatalf("chaos: %v", err)
	}
	return grpc.Creds(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: caPool(),
	}))
}

// passThrough dials target with the identities of each caller: a gRPC
// proxy in front of a coordinator (a reply dropper, a forwarder, the
// holder merger) must not change who the coordinator authorizes, so for
// every set of identities it sees it presents a certificate naming the
// same ones (the test holds the CA's key), one connection per set.
type passThrough struct {
	target string

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

func newPassThrough(t testing.TB, target string) *passThrough {
	p := &passThrough{target: target, conns: map[string]*grpc.ClientConn{}}
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	return p
}

// conn is the connection that acts as ctx's caller.
func (p *passThrough) conn(ctx context.Context) (*grpc.ClientConn, error) {
	peer := tlsfiles.PeerCertificate(ctx)
	if peer == nil {
		return nil, fmt.Errorf("chaos proxy: the caller presented no certificate")
	}
	var uris []string
	for _, u := range peer.URIs {
		uris = append(uris, u.String())
	}
	slices.Sort(uris)
	key := strings.Join(uris, " ")
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.conns[key]; ok {
		return c, nil
	}
	cert, err := identity(uris...)
	if err != nil {
		return nil, err
	}
	c, err := grpc.NewClient(p.target, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12, RootCAs: caPool(), Certificates: []tls.Certificate{cert},
	})))
	if err != nil {
		return nil, err
	}
	p.conns[key] = c
	return c, nil
}

// leases is the Leases client that acts as ctx's caller.
func (p *passThrough) leases(ctx context.Context) (rationv1.LeasesClient, error) {
	c, err := p.conn(ctx)
	if err != nil {
		return nil, err
	}
	return rationv1.NewLeasesClient(c), nil
}
