package tlsfiles_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/certgen"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

func newCA(t *testing.T, name string) *certgen.CA {
	t.Helper()
	ca, err := certgen.NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t *testing.T, ca *certgen.CA, dir, name string, uris ...string) tlsfiles.Files {
	t.Helper()
	p, err := ca.WriteFiles(dir, name, certgen.Request{
		CommonName: name, URIs: uris, DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tlsfiles.Files{Cert: p.Cert, Key: p.Key, CA: p.CA}
}

func open(t *testing.T, f tlsfiles.Files, interval time.Duration, log io.Writer) *tlsfiles.Source {
	t.Helper()
	if log == nil {
		log = io.Discard
	}
	s, err := tlsfiles.Open(f, tlsfiles.Options{Interval: interval, Logger: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// echoServer accepts mutual-TLS connections on loopback and echoes lines,
// prefixed with the subject of the client's certificate.
func echoServer(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := c.(*tls.Conn)
				if err := tc.Handshake(); err != nil {
					return
				}
				cn := tc.ConnectionState().PeerCertificates[0].Subject.CommonName
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := io.WriteString(c, cn+":"+line); err != nil {
						return
					}
				}
			}()
		}
	}()
	return lis.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, msg string) string {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("read answer to %q: %v", msg, err)
	}
	return strings.TrimSuffix(line, "\n")
}

func dial(addr string, cfg *tls.Config) (*tls.Conn, error) {
	return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
}

func TestMutualTLS(t *testing.T) {
	ca := newCA(t, "ca")
	dir := t.TempDir()
	srv := open(t, issue(t, ca, dir, "server"), time.Hour, nil)
	cli := open(t, issue(t, ca, dir, "client"), time.Hour, nil)
	addr := echoServer(t, srv.ServerConfig(nil))
	c, err := dial(addr, cli.ClientConfig("127.0.0.1", nil))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := roundTrip(t, c, bufio.NewReader(c), "hi"); got != "client:hi" {
		t.Fatalf("answer %q, want client:hi", got)
	}
	if got := c.ConnectionState().PeerCertificates[0].Subject.CommonName; got != "server" {
		t.Fatalf("server certificate %q, want server", got)
	}
}

func TestRefusals(t *testing.T) {
	ca, other := newCA(t, "ca"), newCA(t, "other")
	dir, odir := t.TempDir(), t.TempDir()
	srv := open(t, issue(t, ca, dir, "server"), time.Hour, nil)
	cli := open(t, issue(t, ca, dir, "client", tlsfiles.URI(tlsfiles.RoleAgent, "a1")), time.Hour, nil)
	stranger := open(t, issue(t, other, odir, "stranger"), time.Hour, nil)

	t.Run("client of another CA", func(t *testing.T) {
		addr := echoServer(t, srv.ServerConfig(nil))
		// The stranger trusts the server's CA, so only the server refuses.
		cfg := stranger.ClientConfig("127.0.0.1", nil)
		cfg.InsecureSkipVerify, cfg.VerifyConnection = true, nil
		expectRefused(t, addr, cfg)
	})
	t.Run("client without certificate", func(t *testing.T) {
		addr := echoServer(t, srv.ServerConfig(nil))
		expectRefused(t, addr, &tls.Config{InsecureSkipVerify: true})
	})
	t.Run("server of another CA", func(t *testing.T) {
		addr := echoServer(t, stranger.ServerConfigNoClientCert())
		if _, err := dial(addr, cli.ClientConfig("127.0.0.1", nil)); err == nil || !strings.Contains(err.Error(), "unknown authority") {
			t.Fatalf("dial: %v, want an unknown authority error", err)
		}
	})
	t.Run("server name not in its certificate", func(t *testing.T) {
		addr := echoServer(t, srv.ServerConfig(nil))
		if _, err := dial(addr, cli.ClientConfig("coordinator.example", nil)); err == nil || !strings.Contains(err.Error(), "coordinator.example") {
			t.Fatalf("dial: %v, want a name mismatch error", err)
		}
	})
	t.Run("authorize refuses a role", func(t *testing.T) {
		addr := echoServer(t, srv.ServerConfig(tlsfiles.RequireRole(tlsfiles.RoleCoordinator)))
		expectRefused(t, addr, cli.ClientConfig("127.0.0.1", nil))
	})
	t.Run("authorize admits a role", func(t *testing.T) {
		addr := echoServer(t, srv.ServerConfig(tlsfiles.RequireRole(tlsfiles.RoleCoordinator, tlsfiles.RoleAgent)))
		c, err := dial(addr, cli.ClientConfig("127.0.0.1", nil))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		roundTrip(t, c, bufio.NewReader(c), "x")
	})
}

// expectRefused dials addr with cfg: under TLS 1.3 the client's handshake
// ends before the server has judged its certificate, so the refusal shows
// on the first read.
func expectRefused(t *testing.T, addr string, cfg *tls.Config) {
	t.Helper()
	c, err := dial(addr, cfg)
	if err != nil {
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "x\n")
	if line, err := bufio.NewReader(c).ReadString('\n'); err == nil {
		t.Fatalf("server answered %q, want the connection refused", line)
	}
}

// swapSymlink replaces path the way cert-manager's volume does: the
// new content is written elsewhere and a symlink swapped onto it.
func swapSymlink(t *testing.T, link, target string) {
	t.Helper()
	tmp := link + ".tmp"
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

// TestRotation rotates the server's and the client's certificates, and
// the CA, by symlink swaps while a connection is open: the connection
// keeps working (a handshake is never redone), new connections present the
// new certificates, and a client of the retired CA is refused.
func TestRotation(t *testing.T) {
	oldCA, newCAx := newCA(t, "old-ca"), newCA(t, "new-ca")
	dir := t.TempDir()
	gen1, gen2 := filepath.Join(dir, "gen1"), filepath.Join(dir, "gen2")
	for _, d := range []string{gen1, gen2} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i, g := range []struct {
		dir string
		ca  *certgen.CA
	}{{gen1, oldCA}, {gen2, newCAx}} {
		// Files named by role, not by generation, as a secret's keys are.
		for _, kind := range []string{"server", "client"} {
			_, err := g.ca.WriteFiles(g.dir, kind, certgen.Request{
				CommonName: fmt.Sprintf("%s-%d", kind, i+1), IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	// The live directory: data -> gen1, and every file a link through data,
	// as the kubelet lays out a secret volume.
	data := filepath.Join(dir, "data")
	if err := os.Symlink("gen1", data); err != nil {
		t.Fatal(err)
	}
	live := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.Symlink(filepath.Join("data", name), p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ca := live("ca.crt")
	srvFiles := tlsfiles.Files{Cert: live("server.crt"), Key: live("server.key"), CA: ca}
	cliFiles := tlsfiles.Files{Cert: live("client.crt"), Key: live("client.key"), CA: ca}

	log := &harness.LogBuffer{}
	srv := open(t, srvFiles, 20*time.Millisecond, log)
	cli := open(t, cliFiles, 20*time.Millisecond, log)
	addr := echoServer(t, srv.ServerConfig(nil))
	// A client still on the old material, to show the old CA is retired.
	oldCli := open(t, tlsfiles.Files{Cert: filepath.Join(gen1, "client.crt"), Key: filepath.Join(gen1, "client.key"), CA: filepath.Join(gen1, "ca.crt")}, time.Hour, nil)

	inFlight, err := dial(addr, cli.ClientConfig("127.0.0.1", nil))
	if err != nil {
		t.Fatal(err)
	}
	defer inFlight.Close()
	r := bufio.NewReader(inFlight)
	if got := roundTrip(t, inFlight, r, "before"); got != "client-1:before" {
		t.Fatalf("before rotation: %q", got)
	}

	swapSymlink(t, data, "gen2")
	waitFor(t, func() bool { return srv.Reloads() == 1 && cli.Reloads() == 1 }, "both sides reload")

	if got := roundTrip(t, inFlight, r, "after"); got != "client-1:after" {
		t.Fatalf("connection in flight after rotation: %q, want client-1:after", got)
	}
	fresh, err := dial(addr, cli.ClientConfig("127.0.0.1", nil))
	if err != nil {
		t.Fatalf("new connection after rotation: %v", err)
	}
	defer fresh.Close()
	if got := roundTrip(t, fresh, bufio.NewReader(fresh), "new"); got != "client-2:new" {
		t.Fatalf("new connection: %q, want client-2:new", got)
	}
	if cn := fresh.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "server-2" {
		t.Fatalf("server presented %q after rotation, want server-2", cn)
	}
	cfg := oldCli.ClientConfig("127.0.0.1", nil)
	cfg.InsecureSkipVerify, cfg.VerifyConnection = true, nil
	expectRefused(t, addr, cfg)
	if !strings.Contains(log.String(), "TLS material reloaded") {
		t.Fatalf("no reload logged:\n%s", log.String())
	}
}

// TestReloadFailureKeepsOld writes a key that does not match the
// certificate: the old pair stays in force (and serves), the failure is
// logged once, and the matching key then completes the rotation.
func TestReloadFailureKeepsOld(t *testing.T) {
	ca := newCA(t, "ca")
	dir, next := t.TempDir(), t.TempDir()
	f := issue(t, ca, dir, "server")
	n := issue(t, ca, next, "server")
	log := &harness.LogBuffer{}
	srv := open(t, f, time.Hour, log)
	cli := open(t, issue(t, ca, t.TempDir(), "client"), time.Hour, nil)
	addr := echoServer(t, srv.ServerConfig(nil))

	copyFile(t, n.Cert, f.Cert) // the new certificate, the old key
	for range 3 {
		if changed, err := srv.Reload(); changed || err == nil {
			t.Fatalf("Reload with a mismatched key: changed %v, err %v; want the old pair kept and an error", changed, err)
		}
	}
	if got := strings.Count(log.String(), "could not be reloaded"); got != 1 {
		t.Fatalf("%d failure lines for one bad content, want 1:\n%s", got, log.String())
	}
	c, err := dial(addr, cli.ClientConfig("127.0.0.1", nil))
	if err != nil {
		t.Fatalf("dial while the files are inconsistent: %v", err)
	}
	c.Close()
	if srv.Leaf().SerialNumber.Cmp(mustLeaf(t, n.Cert).SerialNumber) == 0 {
		t.Fatal("the mismatched certificate went into force")
	}

	copyFile(t, n.Key, f.Key)
	if changed, err := srv.Reload(); !changed || err != nil {
		t.Fatalf("Reload with the matching key: changed %v, err %v", changed, err)
	}
	if srv.Leaf().SerialNumber.Cmp(mustLeaf(t, n.Cert).SerialNumber) != 0 {
		t.Fatal("the new certificate is not in force")
	}
	if srv.Failures() != 3 || srv.Reloads() != 1 {
		t.Fatalf("failures %d, reloads %d; want 3, 1", srv.Failures(), srv.Reloads())
	}

	// A file that disappears (a rotation half done) keeps the pair too.
	os.Remove(f.CA)
	if _, err := srv.Reload(); err == nil {
		t.Fatal("Reload without a CA file: no error")
	}
	c, err = dial(addr, cli.ClientConfig("127.0.0.1", nil))
	if err != nil {
		t.Fatalf("dial while the CA file is missing: %v", err)
	}
	c.Close()
}

func TestOpenErrors(t *testing.T) {
	ca := newCA(t, "ca")
	dir := t.TempDir()
	f := issue(t, ca, dir, "server")
	for _, tc := range []struct {
		name string
		f    tlsfiles.Files
		want string
	}{
		{"nothing", tlsfiles.Files{}, "no files"},
		{"no key", tlsfiles.Files{Cert: f.Cert, CA: f.CA}, "-tls-key"},
		{"missing file", tlsfiles.Files{Cert: f.Cert, Key: f.Key, CA: filepath.Join(dir, "nope")}, "no such file"},
		{"CA not PEM", tlsfiles.Files{Cert: f.Cert, Key: f.Key, CA: f.Key}, "no PEM certificate"},
		{"key of another cert", tlsfiles.Files{Cert: f.Cert, Key: issue(t, ca, t.TempDir(), "x").Key, CA: f.CA}, "private key does not match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tlsfiles.Open(tc.f, tlsfiles.Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestNames(t *testing.T) {
	ca := newCA(t, "ca")
	f := issue(t, ca, t.TempDir(), "n1", "ration://coordinator/n1", "ration://region/eu", "ration://agent/", "https://agent/x", "ration://operator/ops?x=1")
	leaf := mustLeaf(t, f.Cert)
	for _, tc := range []struct {
		role tlsfiles.Role
		want []string
	}{
		{tlsfiles.RoleCoordinator, []string{"n1"}},
		{tlsfiles.RoleRegion, []string{"eu"}},
		{tlsfiles.RoleAgent, nil},
		{tlsfiles.RoleOperator, nil},
	} {
		got := tlsfiles.Names(leaf, tc.role)
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("Names(%s) = %q, want %q", tc.role, got, tc.want)
		}
	}
	if tlsfiles.Has(leaf, tlsfiles.RoleAgent, "n1") {
		t.Error("the common name granted an agent identity")
	}
	if err := tlsfiles.RequireRole(tlsfiles.RoleOperator)(leaf); err == nil {
		t.Error("RequireRole(operator) admitted a coordinator certificate")
	}
}

// TestOddURIsNameNothing: an identity is ration://<role>/<name> exactly;
// a URI that a reader could take for one role or another names none.
func TestOddURIsNameNothing(t *testing.T) {
	ca := newCA(t, "ca")
	for _, tc := range []struct {
		uri  string
		role tlsfiles.Role
	}{
		{"ration://agent@operator/ops", tlsfiles.RoleOperator},
		{"ration://agent@operator/ops", tlsfiles.RoleAgent},
		{"ration://operator@agent/ops", tlsfiles.RoleAgent},
		{"ration://ops:pw@operator/ops", tlsfiles.RoleOperator},
		{"ration://operator:8303/ops", tlsfiles.RoleOperator},
		{"ration://operator/ops?", tlsfiles.RoleOperator},
		{"ration://operator/ops#x", tlsfiles.RoleOperator},
		{"ration:operator/ops", tlsfiles.RoleOperator},
		{"ration://agent/gw%2Fa", tlsfiles.RoleAgent},
	} {
		t.Run(tc.uri, func(t *testing.T) {
			leaf := mustLeaf(t, issue(t, ca, t.TempDir(), "odd", tc.uri).Cert)
			if got := tlsfiles.Names(leaf, tc.role); len(got) != 0 {
				t.Errorf("%s names %s %q, want nothing", tc.uri, tc.role, got)
			}
		})
	}
}

// A coordinator identity names its group and id; one without a group
// (the form before groups) is no member of any, and the checks a client
// or a peer makes follow the group and the id.
func TestMembers(t *testing.T) {
	ca := newCA(t, "ca")
	for _, tc := range []struct {
		name    string
		uris    []string
		members string
		global  bool // RequireCoordinator("global") admits it
		any     bool // RequireCoordinator("") admits it
		g1      bool // RequireMember("global", "n1") admits it
		us      bool // RequireCoordinator("us", "global") admits it (an agent of region us)
	}{
		{"global member", []string{"ration://coordinator/global/n1"}, "[global/n1]", true, true, true, true},
		{"regional member", []string{"ration://coordinator/eu/n1", "ration://region/eu"}, "[eu/n1]", false, true, false, false},
		{"member of us", []string{"ration://coordinator/us/n1", "ration://region/us"}, "[us/n1]", false, true, false, true},
		{"another id", []string{"ration://coordinator/global/n2"}, "[global/n2]", true, true, false, true},
		{"id with a slash", []string{"ration://coordinator/global/a/b"}, "[global/a/b]", true, true, false, true},
		{"before groups", []string{"ration://coordinator/n1"}, "[]", false, false, false, false},
		{"empty id", []string{"ration://coordinator/global/"}, "[]", false, false, false, false},
		{"agent", []string{"ration://agent/n1"}, "[]", false, false, false, false},
		{"operator", []string{"ration://operator/global/n1"}, "[]", false, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leaf := mustLeaf(t, issue(t, ca, t.TempDir(), "c", tc.uris...).Cert)
			if got := fmt.Sprint(tlsfiles.Members(leaf)); got != tc.members {
				t.Errorf("Members = %s, want %s", got, tc.members)
			}
			for _, c := range []struct {
				what string
				err  error
				want bool
			}{
				{`RequireCoordinator("global")`, tlsfiles.RequireCoordinator("global")(leaf), tc.global},
				{`RequireCoordinator("")`, tlsfiles.RequireCoordinator("")(leaf), tc.any},
				{`RequireMember("global", "n1")`, tlsfiles.RequireMember("global", "n1")(leaf), tc.g1},
				{`RequireCoordinator("us", "global")`, tlsfiles.RequireCoordinator("us", "global")(leaf), tc.us},
			} {
				if (c.err == nil) != c.want {
					t.Errorf("%s: %v, want admitted %v", c.what, c.err, c.want)
				}
				if c.err != nil && !errors.Is(c.err, tlsfiles.ErrNotCoordinator) {
					t.Errorf("%s: %v, want ErrNotCoordinator", c.what, c.err)
				}
			}
		})
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func mustLeaf(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReloadRefusesBadCertificates: a rotation that writes an expired
// certificate, or one of another identity (refused by Options.Check), is
// not put in force: the good one keeps serving, each refusal is logged, and
// a good certificate then goes in force.
func TestReloadRefusesBadCertificates(t *testing.T) {
	ca := newCA(t, "ca")
	dir := t.TempDir()
	f := issue(t, ca, dir, "server", "ration://agent/a")
	log := &harness.LogBuffer{}
	srv, err := tlsfiles.Open(f, tlsfiles.Options{Interval: time.Hour, Logger: slog.New(slog.NewTextHandler(log, nil)),
		Check: func(leaf *x509.Certificate) error {
			if !tlsfiles.Has(leaf, tlsfiles.RoleAgent, "a") {
				return errors.New("not agent a")
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	good := srv.Leaf().SerialNumber
	cli := open(t, issue(t, ca, t.TempDir(), "client"), time.Hour, nil)
	addr := echoServer(t, srv.ServerConfig(nil))

	write := func(r certgen.Request) {
		t.Helper()
		certPEM, keyPEM, err := ca.Issue(r)
		if err != nil {
			t.Fatal(err)
		}
		// The key first, then the certificate: the pair is consistent once
		// the second is written.
		if err := os.WriteFile(f.Key, keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f.Cert, certPEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ips := []net.IP{net.IPv4(127, 0, 0, 1)}
	for _, tc := range []struct {
		name string
		r    certgen.Request
		want string
	}{
		{"expired", certgen.Request{CommonName: "expired", URIs: []string{"ration://agent/a"}, IPs: ips, NotAfter: time.Now().Add(-time.Minute)}, "expired at"},
		{"another agent", certgen.Request{CommonName: "other", URIs: []string{"ration://agent/b"}, IPs: ips}, "not agent a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			write(tc.r)
			if changed, err := srv.Reload(); changed || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Reload: changed %v, err %v; want the old certificate kept and an error saying %q", changed, err, tc.want)
			}
			if srv.Leaf().SerialNumber.Cmp(good) != 0 {
				t.Fatal("the refused certificate went into force")
			}
			c, err := dial(addr, cli.ClientConfig("127.0.0.1", nil))
			if err != nil {
				t.Fatalf("dial after the refused reload: %v", err)
			}
			if cn := c.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "server" {
				t.Errorf("the server presents %q, want the certificate in force (server)", cn)
			}
			c.Close()
			if !strings.Contains(log.String(), tc.want) {
				t.Errorf("the refusal is not logged:\n%s", log.String())
			}
		})
	}
	write(certgen.Request{CommonName: "next", URIs: []string{"ration://agent/a"}, IPs: ips})
	if changed, err := srv.Reload(); !changed || err != nil {
		t.Fatalf("Reload of a good certificate: changed %v, err %v", changed, err)
	}
}
