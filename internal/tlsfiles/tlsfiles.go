// Package tlsfiles serves TLS material read from files: a certificate, its
// key and the CA bundle that peers' certificates must chain to. The files
// are read again every few seconds and, when their content changed, parsed
// and swapped in, so that a rotation (cert-manager swaps a symlink; other
// tools rewrite the files) takes effect without a restart and without
// touching connections already established. A reload that fails (a key that
// does not match its certificate yet, a truncated file) keeps the material
// in force and is logged; the next change is tried again.
//
// The tls.Configs it returns look the material up on every handshake
// (GetCertificate, GetClientCertificate) and verify the peer against the CA
// pool current at that moment (VerifyConnection), which is why the standard
// library's own verification is replaced: tls.Config.ClientCAs and RootCAs
// are fixed once a config is in use.
//
// Files: tlsfiles.go (the files, their reloads and the tls.Configs),
// identity.go (the Ration identities a certificate carries: roles, groups,
// ids), grpc.go (gRPC credentials), handshakelog.go (failed handshakes
// logged, rate-limited).
package tlsfiles

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ration-dev/ration/internal/logformat"
)

// Files names the three files. All or none must be set.
type Files struct {
	Cert string // -tls-cert: PEM certificate chain, leaf first
	Key  string // -tls-key: PEM private key of the leaf
	CA   string // -tls-ca: PEM CA certificates peers must chain to
}

// Enabled reports whether any file is named.
func (f Files) Enabled() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Check reports a partial set: TLS needs all three files.
func (f Files) Check() error {
	if !f.Enabled() || f.Cert != "" && f.Key != "" && f.CA != "" {
		return nil
	}
	var missing []string
	for _, m := range []struct{ flag, v string }{{"-tls-cert", f.Cert}, {"-tls-key", f.Key}, {"-tls-ca", f.CA}} {
		if m.v == "" {
			missing = append(missing, m.flag)
		}
	}
	return fmt.Errorf("TLS needs -tls-cert, -tls-key and -tls-ca together; missing %v", missing)
}

// DefaultInterval is how often the files are checked for a change: a
// rotation is picked up within it. cert-manager renews certificates well
// before they expire (a third of their lifetime by default), so seconds
// are plenty; reading three small files costs microseconds.
const DefaultInterval = 5 * time.Second

// Source holds the current material and reloads it. Its methods are safe
// for concurrent use.
type Source struct {
	files    Files
	logger   *slog.Logger
	interval time.Duration
	check    func(*x509.Certificate) error

	cur atomic.Pointer[material]
	// mu serializes reloads (the poller and explicit Reload calls).
	mu        sync.Mutex
	failedSum [32]byte // content of the last failed reload, logged once
	reloads   atomic.Int64
	failures  atomic.Int64
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type material struct {
	cert *tls.Certificate
	leaf *x509.Certificate
	pool *x509.CertPool
	sum  [32]byte // hash of the three files' contents
}

// Options tune a Source. The zero value is usable.
type Options struct {
	Logger   *slog.Logger  // reloads and reload failures (default: discarded)
	Interval time.Duration // how often the files are checked (default DefaultInterval)
	// Check, when set, must admit every reloaded certificate (for
	// instance: it still names this process's identity); one it refuses
	// is not put in force. The certificate Open reads is the caller's to
	// check.
	Check func(leaf *x509.Certificate) error
}

// Open reads and parses the files (an error here is fatal: there is no
// older material to keep) and starts checking them for changes every
// opts.Interval. Close stops that.
func Open(f Files, opts Options) (*Source, error) {
	if !f.Enabled() {
		return nil, errors.New("tlsfiles: no files named")
	}
	if err := f.Check(); err != nil {
		return nil, fmt.Errorf("tlsfiles: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	s := &Source{files: f, logger: opts.Logger, interval: opts.Interval, check: opts.Check, stop: make(chan struct{}), done: make(chan struct{})}
	m, err := load(f)
	if err != nil {
		return nil, err
	}
	s.cur.Store(m)
	s.logger.Info("TLS material loaded", "cert", f.Cert, "subject", m.leaf.Subject.String(), "not_after", m.leaf.NotAfter)
	go s.poll()
	return s, nil
}

// Close stops the reloading. Configs already handed out keep serving the
// last material.
func (s *Source) Close() {
	s.closeOnce.Do(func() { close(s.stop); <-s.done })
}

func (s *Source) poll() {
	defer close(s.done)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			_, _ = s.Reload()
		}
	}
}

// Reload reads the files now and swaps the material in when their content
// changed and parses. It reports whether new material is in force; an
// error leaves the old one in force (and is logged once per content).
func (s *Source) Reload() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	raw, sum, err := readAll(s.files)
	if err != nil {
		return false, s.failed(sum, err)
	}
	if sum == s.cur.Load().sum {
		return false, nil
	}
	m, err := parse(raw, sum)
	if err == nil {
		err = s.replaces(m.leaf)
	}
	if err != nil {
		return false, s.failed(sum, err)
	}
	s.cur.Store(m)
	s.reloads.Add(1)
	s.failedSum = [32]byte{}
	s.logger.Info("TLS material reloaded", "cert", s.files.Cert, "subject", m.leaf.Subject.String(), "not_after", m.leaf.NotAfter)
	return true, nil
}

// replaces refuses a reloaded certificate that would make every
// handshake fail, or this process another: one outside its validity (an
// old file restored, a clock far off: the one in force may still be
// valid), or one that Options.Check refuses (another agent's, another
// member's).
func (s *Source) replaces(leaf *x509.Certificate) error {
	now := time.Now()
	switch {
	case now.After(leaf.NotAfter):
		return fmt.Errorf("tlsfiles: certificate %q expired at %s", leaf.Subject.String(), leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return fmt.Errorf("tlsfiles: certificate %q is not valid before %s", leaf.Subject.String(), leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	if s.check != nil {
		if err := s.check(leaf); err != nil {
			return fmt.Errorf("tlsfiles: certificate %q refused: %w", leaf.Subject.String(), err)
		}
	}
	return nil
}

// failed logs a reload error once per file content: a half-written
// rotation is retried every interval, and one line says enough.
func (s *Source) failed(sum [32]byte, err error) error {
	s.failures.Add(1)
	if sum != s.failedSum || sum == [32]byte{} {
		s.failedSum = sum
		s.logger.Error("TLS files could not be reloaded; the material in force stays", "cert", s.files.Cert,
			logformat.CauseKey, err.Error())
	}
	return err
}

// Reloads and Failures count the successful and failed reloads since Open.
func (s *Source) Reloads() int64  { return s.reloads.Load() }
func (s *Source) Failures() int64 { return s.failures.Load() }

// Leaf returns the certificate in force.
func (s *Source) Leaf() *x509.Certificate { return s.cur.Load().leaf }

type rawFiles struct{ cert, key, ca []byte }

func readAll(f Files) (rawFiles, [32]byte, error) {
	var r rawFiles
	var err error
	read := func(name string) []byte {
		if err != nil {
			return nil
		}
		var b []byte
		if b, err = os.ReadFile(name); err != nil {
			err = fmt.Errorf("tlsfiles: %w", err)
		}
		return b
	}
	r.cert, r.key, r.ca = read(f.Cert), read(f.Key), read(f.CA)
	if err != nil {
		return r, [32]byte{}, err
	}
	h := sha256.New()
	for _, b := range [][]byte{r.cert, r.key, r.ca} {
		// Length-prefixed, so that moving bytes between files changes the sum.
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return r, sum, nil
}

func load(f Files) (*material, error) {
	raw, sum, err := readAll(f)
	if err != nil {
		return nil, err
	}
	return parse(raw, sum)
}

func parse(r rawFiles, sum [32]byte) (*material, error) {
	cert, err := tls.X509KeyPair(r.cert, r.key)
	if err != nil {
		return nil, fmt.Errorf("tlsfiles: certificate and key: %w", err)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("tlsfiles: certificate: %w", err)
		}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(r.ca) || !bytes.Contains(r.ca, []byte("-----BEGIN CERTIFICATE-----")) {
		return nil, errors.New("tlsfiles: CA file holds no PEM certificate")
	}
	return &material{cert: &cert, leaf: leaf, pool: pool, sum: sum}, nil
}

// Authorize decides whether a verified peer certificate may connect (for
// instance: it names a coordinator). Nil admits every certificate the CA
// signed.
type Authorize func(leaf *x509.Certificate) error

// ServerConfig is a server's config for mutual TLS: it presents the
// current certificate, requires a client certificate chaining to the
// current CA pool (and usable for client authentication), and then asks
// authorize.
func (s *Source) ServerConfig(authorize Authorize) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.cur.Load().cert, nil
		},
		// RequireAnyClientCert makes the client send one; VerifyConnection
		// verifies it against the pool in force now (ClientCAs could not
		// follow a rotated CA bundle).
		ClientAuth: tls.RequireAnyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			leaf, err := s.verify(cs, "", x509.ExtKeyUsageClientAuth)
			if err != nil {
				return err
			}
			if authorize != nil {
				return authorize(leaf)
			}
			return nil
		},
	}
}

// ServerConfigNoClientCert is a server's config that presents the current
// certificate and asks for no client certificate (TLS without mutual
// authentication: the agent's listeners when -tls-client-auth is off).
func (s *Source) ServerConfigNoClientCert() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.cur.Load().cert, nil
		},
	}
}

// ClientConfig is a client's config for mutual TLS with the server
// named serverName (a DNS name or an IP address its certificate must
// carry): it presents the current certificate and verifies the server's
// against the current CA pool and that name, then asks authorize.
func (s *Source) ClientConfig(serverName string, authorize Authorize) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return s.cur.Load().cert, nil
		},
		// Not insecure: VerifyConnection below does the verification the
		// standard library would, with the CA pool current at the
		// handshake rather than one fixed in RootCAs. The name is the one
		// captured here: ConnectionState.ServerName is empty when an IP
		// address is dialed (no SNI is sent for one).
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if serverName == "" {
				return errors.New("tlsfiles: no server name to verify the server's certificate against")
			}
			leaf, err := s.verify(cs, serverName, x509.ExtKeyUsageServerAuth)
			if err != nil {
				return err
			}
			if authorize != nil {
				return authorize(leaf)
			}
			return nil
		},
	}
}

// HostOf returns the host of a host:port address (the address itself when
// it has no port): the name a server's certificate must carry.
func HostOf(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

func (s *Source) verify(cs tls.ConnectionState, name string, usage x509.ExtKeyUsage) (*x509.Certificate, error) {
	if len(cs.PeerCertificates) == 0 {
		return nil, errors.New("tlsfiles: the peer sent no certificate")
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots: s.cur.Load().pool, Intermediates: inter, DNSName: name,
		KeyUsages: []x509.ExtKeyUsage{usage},
	})
	if err != nil {
		return nil, fmt.Errorf("tlsfiles: peer certificate %q: %w", leaf.Subject.String(), err)
	}
	return leaf, nil
}
