package chaos

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/tlsfiles"
)

// LinkProxy sits in front of one Raft node (its -raft-advertise address)
// and can cut that node's links to chosen peers while other links through
// it carry on: something a proxy per node cannot do by address alone,
// since every peer dials the same advertised address. It learns which
// node opened a connection from the first bytes it sends: hashicorp/raft
// begins every request with an RPC header naming the sender's server id.
//
// Isolate(id) blackholes, in both directions, every connection opened by
// node id and, on id's own proxy, every connection into it. Heal lifts it
// and closes the connections that were blackholed (their streams lost
// bytes; Raft dials again).
//
// Under TLS (NewLinkProxiesTLS) the stream is encrypted, so the proxy
// terminates it instead: it completes the handshake as a coordinator of
// the run's CA, learns the sender from the client certificate, and dials
// the node behind it presenting a certificate with the sender's identities
// (the test holds the CA's key), so the node authorizes the same peer.
type LinkProxy struct {
	t        testing.TB
	tls      *tls.Config // server side under TLS; nil: plaintext
	ln       net.Listener
	target   string // id of the node behind this proxy
	ids      []string
	upstream string
	isolated *isolation

	mu    sync.Mutex
	links map[*link]struct{}
}

// isolation is shared by the proxies of one group.
type isolation struct {
	mu sync.Mutex
	id string // "" when none
}

func (s *isolation) get() string { s.mu.Lock(); defer s.mu.Unlock(); return s.id }

type link struct {
	client, server net.Conn
	sender         string
	wasCut         bool
}

// NewLinkProxies starts one proxy per node id, each on a free loopback
// port, forwarding to upstream[i]. They are closed in t.Cleanup.
func NewLinkProxies(t testing.TB, ids, upstream []string) []*LinkProxy {
	t.Helper()
	return newLinkProxies(t, ids, upstream, nil)
}

// NewLinkProxiesTLS is NewLinkProxies for a group whose Raft links are
// mutual TLS with certificates of the run's CA. Each proxy serves the
// certificate of the member behind it (ration://coordinator/<group>/<id>):
// a node dialing a peer checks that the server there is that member.
func NewLinkProxiesTLS(t testing.TB, group string, ids, upstream []string) []*LinkProxy {
	t.Helper()
	return newLinkProxies(t, ids, upstream, func(id string) *tls.Config {
		cert, err := identity(tlsfiles.CoordinatorURI(group, id))
		if err != nil {
			t.Fatalf("chaos: %v", err)
		}
		return &tls.Config{
			MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert},
			ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: caPool(),
		}
	})
}

func newLinkProxies(t testing.TB, ids, upstream []string, tlsConfig func(id string) *tls.Config) []*LinkProxy {
	t.Helper()
	iso := &isolation{}
	var out []*LinkProxy
	for i, id := range ids {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var cfg *tls.Config
		if tlsConfig != nil {
			cfg = tlsConfig(id)
		}
		p := &LinkProxy{t: t, tls: cfg, ln: ln, target: id, ids: ids, upstream: upstream[i], isolated: iso, links: map[*link]struct{}{}}
		go p.accept()
		t.Cleanup(p.close)
		out = append(out, p)
	}
	return out
}

// Addr is the address peers dial.
func (p *LinkProxy) Addr() string { return p.ln.Addr().String() }

// Isolate cuts node id from every peer (all proxies of the group).
func (p *LinkProxy) Isolate(id string) {
	p.isolated.mu.Lock()
	p.isolated.id = id
	p.isolated.mu.Unlock()
}

// Heal lifts the isolation on the group and closes, on this proxy, the
// connections it blackholed. Call it on every proxy of the group.
func (p *LinkProxy) Heal() {
	p.isolated.mu.Lock()
	p.isolated.id = ""
	p.isolated.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		if l.wasCut {
			l.client.Close()
			l.server.Close()
		}
	}
}

func (p *LinkProxy) cut(l *link) bool {
	id := p.isolated.get()
	if id != "" && (l.sender == id || p.target == id) {
		p.mu.Lock()
		l.wasCut = true
		p.mu.Unlock()
		return true
	}
	return false
}

func (p *LinkProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *LinkProxy) serve(c net.Conn) {
	if p.tls != nil {
		p.serveTLS(c)
		return
	}
	s, err := net.DialTimeout("tcp", p.upstream, time.Second)
	if err != nil {
		c.Close()
		return
	}
	l := &link{client: c, server: s}
	defer p.track(l)()
	buf := make([]byte, 32<<10)
	n, err := c.Read(buf)
	if err != nil {
		return
	}
	l.sender = senderOf(buf[:n], p.ids)
	p.splice(l, buf[:n])
}

// serveTLS terminates the sender's TLS and forwards over a TLS connection
// of its own that carries the sender's identities.
func (p *LinkProxy) serveTLS(raw net.Conn) {
	c := tls.Server(raw, p.tls)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.HandshakeContext(ctx); err != nil {
		c.Close()
		return
	}
	peer := c.ConnectionState().PeerCertificates[0]
	var uris []string
	for _, u := range peer.URIs {
		uris = append(uris, u.String())
	}
	sender := ""
	if members := tlsfiles.Members(peer); len(members) > 0 {
		sender = members[0].ID
	}
	cert, err := identity(uris...)
	if err != nil {
		c.Close()
		return
	}
	s, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", p.upstream, &tls.Config{
		MinVersion: tls.VersionTLS12, RootCAs: caPool(), Certificates: []tls.Certificate{cert},
		ServerName: tlsfiles.HostOf(p.upstream),
	})
	if err != nil {
		c.Close()
		return
	}
	l := &link{client: c, server: s, sender: sender}
	defer p.track(l)()
	p.splice(l, nil)
}

// track registers l, so that Heal and close reach it; the returned func
// closes both ends and forgets it.
func (p *LinkProxy) track(l *link) func() {
	p.mu.Lock()
	p.links[l] = struct{}{}
	p.mu.Unlock()
	return func() {
		l.client.Close()
		l.server.Close()
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}
}

// splice copies both ways until one direction ends; first (already read
// from the client) goes to the server first.
func (p *LinkProxy) splice(l *link, first []byte) {
	done := make(chan struct{}, 2)
	go func() { p.pipe(l, l.server, l.client, nil); done <- struct{}{} }()
	go func() { p.pipe(l, l.client, l.server, first); done <- struct{}{} }()
	<-done
}

// pipe copies src to dst (first, already read, goes first), dropping
// what arrives while the link is cut.
func (p *LinkProxy) pipe(l *link, src, dst net.Conn, first []byte) {
	defer dst.Close()
	defer src.Close()
	if len(first) > 0 && !p.cut(l) {
		if _, err := dst.Write(first); err != nil {
			return
		}
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.cut(l) {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// senderOf finds the id that occurs first in a Raft request's opening
// bytes: the RPC header (the sender's id) precedes everything else.
func senderOf(b []byte, ids []string) string {
	best, at := "", -1
	for _, id := range ids {
		if i := bytes.Index(b, []byte(id)); i >= 0 && (at < 0 || i < at) {
			best, at = id, i
		}
	}
	return best
}

func (p *LinkProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.client.Close()
		l.server.Close()
	}
}
