package harness

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ration-dev/ration/internal/certgen"
	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

// PKI is a test's certificate authority: an ephemeral CA in t.TempDir()
// that issues certificates for loopback (IP 127.0.0.1, DNS localhost)
// carrying Ration identities (docs/security.md).
type PKI struct {
	t   testing.TB
	CA  *certgen.CA
	dir string

	mu sync.Mutex
	n  int
}

// NewPKI makes a CA valid for a day.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	ca, err := certgen.NewCA("ration test CA", 24*time.Hour)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	return &PKI{t: t, CA: ca, dir: t.TempDir()}
}

// NewPKIWithCA is NewPKI over an existing CA, so that the PKIs of several
// tests trust each other's certificates (the chaos suite makes one CA for
// the run and gives every scenario's processes certificates of it).
func NewPKIWithCA(t testing.TB, ca *certgen.CA) *PKI {
	t.Helper()
	return &PKI{t: t, CA: ca, dir: t.TempDir()}
}

// Issue writes a certificate named name with identities uris (each
// ration://<role>/<name>; none: a certificate of the CA that authorizes
// nothing) to a directory of its own, and returns its files.
func (p *PKI) Issue(name string, uris ...string) tlsfiles.Files {
	p.t.Helper()
	return p.IssueFor(name, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, uris...)
}

// IssueFor is Issue for a holder reached by other names: the certificate
// names only dnsNames and ips (none of them: a certificate that names no
// host, which no client checking the name accepts).
func (p *PKI) IssueFor(name string, dnsNames []string, ips []net.IP, uris ...string) tlsfiles.Files {
	p.t.Helper()
	p.mu.Lock()
	p.n++
	dir := filepath.Join(p.dir, fmt.Sprintf("%03d-%s", p.n, name))
	p.mu.Unlock()
	if err := os.Mkdir(dir, 0o700); err != nil {
		p.t.Fatalf("harness: %v", err)
	}
	paths, err := p.CA.WriteFiles(dir, "tls", certgen.Request{
		CommonName: name, URIs: uris, DNSNames: dnsNames, IPs: ips,
	})
	if err != nil {
		p.t.Fatalf("harness: %v", err)
	}
	return tlsfiles.Files{Cert: paths.Cert, Key: paths.Key, CA: paths.CA}
}

// Agent issues the certificate of agent id (holder id).
func (p *PKI) Agent(id string) tlsfiles.Files {
	return p.Issue("agent-"+id, tlsfiles.URI(tlsfiles.RoleAgent, id))
}

// Member issues the certificate of coordinator id of group
// (ration://coordinator/<group>/<id>), with extra identities.
func (p *PKI) Member(group, id string, extra ...string) tlsfiles.Files {
	return p.Issue("coordinator-"+group+"-"+id, append([]string{tlsfiles.CoordinatorURI(group, id)}, extra...)...)
}

// Operator issues an operator's certificate (the admin API).
func (p *PKI) Operator(name string) tlsfiles.Files {
	return p.Issue("operator-"+name, tlsfiles.URI(tlsfiles.RoleOperator, name))
}

// Gateway issues a gateway's certificate (an agent's listeners with
// -listen-client-auth).
func (p *PKI) Gateway(name string) tlsfiles.Files {
	return p.Issue("gateway-"+name, tlsfiles.URI(tlsfiles.RoleGateway, name))
}

// Source opens files, closed at cleanup.
func (p *PKI) Source(f tlsfiles.Files) *tlsfiles.Source {
	p.t.Helper()
	s, err := tlsfiles.Open(f, tlsfiles.Options{Interval: 50 * time.Millisecond})
	if err != nil {
		p.t.Fatalf("harness: %v", err)
	}
	p.t.Cleanup(s.Close)
	return s
}

// DialOptions dial a coordinator with the certificate in f.
func (p *PKI) DialOptions(f tlsfiles.Files) []grpc.DialOption {
	return []grpc.DialOption{grpc.WithTransportCredentials(p.Source(f).ClientCredentials("", nil))}
}

// Coordinator is a StartCoordinators option giving each node a
// certificate of its own: ration://coordinator/<group>/<id> (the group is
// the node's -region, or global), and ration://region/<region> when the
// node has a -region (the leader of a regional group holds leases from
// the global group as that region). Put it after the options that set the
// region. The files are checked for changes every 50ms.
func (p *PKI) Coordinator(cfg *coordinator.Config) {
	uris := []string{tlsfiles.CoordinatorURI(cfg.Group(), cfg.ID)}
	if cfg.Region != "" {
		uris = append(uris, tlsfiles.URI(tlsfiles.RoleRegion, cfg.Region))
	}
	cfg.TLS = p.Issue("coordinator-"+cfg.ID, uris...)
	cfg.Insecure = false
	cfg.TLSReloadInterval = 50 * time.Millisecond
}

// Reissue issues a new certificate (and key) with identities uris and
// writes them over f's files, each by a rename, as a rotation would: a
// process reading f picks them up at its next check.
func (p *PKI) Reissue(f tlsfiles.Files, name string, uris ...string) {
	p.t.Helper()
	p.ReissueWith(f, certgen.Request{
		CommonName: name, URIs: uris, DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
	})
}

// ReissueWith is Reissue of the certificate r asks for (an expired one,
// other names).
func (p *PKI) ReissueWith(f tlsfiles.Files, r certgen.Request) {
	p.t.Helper()
	certPEM, keyPEM, err := p.CA.Issue(r)
	if err != nil {
		p.t.Fatalf("harness: %v", err)
	}
	for _, w := range []struct {
		path string
		b    []byte
	}{{f.Key, keyPEM}, {f.Cert, certPEM}} {
		tmp := w.path + ".new"
		if err := os.WriteFile(tmp, w.b, 0o600); err != nil {
			p.t.Fatalf("harness: %v", err)
		}
		if err := os.Rename(tmp, w.path); err != nil {
			p.t.Fatalf("harness: %v", err)
		}
	}
}
