package coordinator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/region"
	"github.com/ration-dev/ration/internal/tlsfiles"
	"github.com/ration-dev/ration/internal/tokenfile"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Who may do what, when the node runs with TLS (docs/security.md). Every
// link is mutual TLS with certificates of the one CA bundle (-tls-ca); what
// a client may do follows from the identities its certificate names as URI
// SANs (tlsfiles.Role):
//
//   - the Raft transport admits only the members of this node's group
//     (ration://coordinator/<group>/<id>, <id> in the Raft configuration),
//     both ways (raftpeers.go): no other group's coordinator, and no
//     agent, can append entries or vote;
//   - Leases calls (Renew, Release, Watch) for holder H need
//     ration://agent/ID when H is ID or ID/<incarnation> (the agent's wire
//     name), or ration://region/R when H is region/R: one agent cannot
//     renew, release or replay another's leases, nor act as a region;
//   - Admin calls, served on the -admin listener only (the lease port
//     answers them Unimplemented), need ration://operator/<name>; a
//     member of this group (ration://coordinator/<group>/<id>) may call
//     AddVoter for itself alone (-join), and only when its id is in the
//     configuration or registered (membership.go), and Status while it
//     is either.
//
// With -admin-token-file, every admin call must also carry the token
// (metadata authorization: Bearer <token>), with TLS or without.
//
// Without TLS (-insecure, -dev) no certificate is checked: every client of
// the lease and Raft ports is trusted, and every client of the admin port
// that has the token (when one is set), which is why that mode says so at
// start-up.

// ErrPermissionDenied marks a call refused for the caller's identity: no
// state changed. It is answered PERMISSION_DENIED.
var ErrPermissionDenied = errors.New("permission denied")

// authorizeHolder refuses a Leases call for holder unless the client's
// certificate names it.
func (n *Node) authorizeHolder(ctx context.Context, holder string) error {
	if n.tls == nil {
		return nil
	}
	cert := tlsfiles.PeerCertificate(ctx)
	if cert == nil {
		return fmt.Errorf("%w: no client certificate", ErrPermissionDenied)
	}
	// A holder name of the region form is a region's whatever follows, so
	// that no agent identity can ever spell one.
	if strings.HasPrefix(holder, "region/") {
		id, ok := region.FromHolder(holder)
		if ok && tlsfiles.Has(cert, tlsfiles.RoleRegion, string(id)) {
			return nil
		}
		return fmt.Errorf("%w: holder %q is a region's, and this client's certificate names regions %q (needs URI SAN %s)",
			ErrPermissionDenied, holder, tlsfiles.Names(cert, tlsfiles.RoleRegion), tlsfiles.URI(tlsfiles.RoleRegion, string(id)))
	}
	// An agent's holder name is <id>/<incarnation> (internal/holder): the
	// certificate names the id, and every incarnation of it is that agent.
	id, _, _ := strings.Cut(holder, "/")
	if tlsfiles.Has(cert, tlsfiles.RoleAgent, id) {
		return nil
	}
	return fmt.Errorf("%w: holder %q is not this client's: its certificate names agents %q (needs URI SAN %s)",
		ErrPermissionDenied, holder, tlsfiles.Names(cert, tlsfiles.RoleAgent), tlsfiles.URI(tlsfiles.RoleAgent, id))
}

// ErrUnauthenticated marks an admin call without the admin token, or with
// another: no state changed. It is answered UNAUTHENTICATED.
var ErrUnauthenticated = errors.New("unauthenticated")

// authorizeAdmin refuses an Admin call unless (under TLS) the client's
// certificate names an operator, or a member of this node's group calling
// AddVoter for itself (a node joining through -join, or updating its own
// addresses) or Status (the members' health probes), and (with -admin-token-file) the call carries the admin
// token. req is the call's request (nil for a stream).
func (n *Node) authorizeAdmin(ctx context.Context, method string, req any) error {
	if n.tls != nil {
		cert := tlsfiles.PeerCertificate(ctx)
		if cert == nil {
			return fmt.Errorf("%w: admin calls need a client certificate", ErrPermissionDenied)
		}
		if err := n.authorizeAdminCert(cert, method, req); err != nil {
			return err
		}
	}
	if n.token != nil {
		md, _ := metadata.FromIncomingContext(ctx)
		v := md.Get(tokenfile.MetadataKey)
		if len(v) == 0 {
			return fmt.Errorf("%w: admin calls need the token of -admin-token-file (metadata %s: %s <token>; the CLI's -token-file)",
				ErrUnauthenticated, tokenfile.MetadataKey, tokenfile.Scheme)
		}
		tok, ok := tokenfile.FromHeader(v[0])
		if !ok || len(v) > 1 || !n.token.Match(tok) {
			return fmt.Errorf("%w: the admin token does not match this node's -admin-token-file", ErrUnauthenticated)
		}
	}
	return nil
}

// authorizeAdminCert is authorizeAdmin's certificate check. A
// coordinator's certificate is not an operator's: it can add or update
// only its own member record, in its own group, so that a member of one
// group cannot rewrite another's addresses (and send the clients
// redirected there to a host of its choosing), nor tune anything.
func (n *Node) authorizeAdminCert(cert *x509.Certificate, method string, req any) error {
	if tlsfiles.HasRole(cert, tlsfiles.RoleOperator) {
		return nil
	}
	group := n.cfg.Group()
	ids := tlsfiles.MemberIDs(cert, group)
	if len(ids) == 0 {
		return fmt.Errorf("%w: admin calls need an operator certificate (URI SAN %s); this one names %s",
			ErrPermissionDenied, tlsfiles.URI(tlsfiles.RoleOperator, "<name>"), identities(cert))
	}
	member := slices.ContainsFunc(ids, n.mayAddItself)
	if method == rationv1.Admin_Status_FullMethodName {
		// The members probe each other's Status for their health
		// (health.go), and a joining node asks its target for the
		// members: it tells a member nothing Raft has not told it. A
		// certificate of the group that is neither a member nor
		// registered learns nothing.
		if !member {
			return fmt.Errorf("%w: Status: this certificate names %q of group %q, none of them a member or registered to join (an operator registers one: coordinator members allow -id <id>)",
				ErrPermissionDenied, ids, group)
		}
		return nil
	}
	if method != rationv1.Admin_AddVoter_FullMethodName {
		return fmt.Errorf("%w: %s needs an operator certificate (URI SAN %s): a coordinator's (members %q of group %q) may only add itself (AddVoter) and read Status",
			ErrPermissionDenied, method, tlsfiles.URI(tlsfiles.RoleOperator, "<name>"), ids, group)
	}
	r, _ := req.(*rationv1.AddVoterRequest)
	if r == nil || !slices.Contains(ids, r.GetId()) {
		return fmt.Errorf("%w: a coordinator's certificate may only add or update itself: it names members %q of group %q, and the request is for server %q (needs URI SAN %s, or an operator's)",
			ErrPermissionDenied, ids, group, r.GetId(), tlsfiles.CoordinatorURI(group, r.GetId()))
	}
	if !n.mayAddItself(r.GetId()) {
		return fmt.Errorf("%w: server %q of group %q is neither a member nor registered to join: an operator registers it first (coordinator members allow -id %s, or the first node's -initial-members); a removed member stays out until registered again",
			ErrPermissionDenied, r.GetId(), group, r.GetId())
	}
	return nil
}

// identities lists the URI SANs of cert, for refusals.
func identities(cert *x509.Certificate) string {
	var uris []string
	for _, u := range cert.URIs {
		uris = append(uris, u.String())
	}
	if len(uris) == 0 {
		return "no URI SAN"
	}
	return fmt.Sprintf("URI SANs %q", uris)
}

// checkOwnIdentity refuses a certificate that does not name this node as
// a member of its group: every peer would refuse it, and a certificate of
// another role (an agent's) must not serve as a coordinator.
func checkOwnIdentity(leaf *x509.Certificate, cfg Config) error {
	group := cfg.Group()
	if slices.Contains(tlsfiles.MemberIDs(leaf, group), cfg.ID) {
		return nil
	}
	hint := ""
	if slices.Contains(tlsfiles.Names(leaf, tlsfiles.RoleCoordinator), cfg.ID) {
		hint = fmt.Sprintf(" (%s is the form before identities were scoped to their group: re-issue the certificate; docs/security.md, \"Upgrading certificates\")",
			tlsfiles.URI(tlsfiles.RoleCoordinator, cfg.ID))
	}
	return fmt.Errorf("%w: -tls-cert %s names %s, not this node: a coordinator's certificate needs URI SAN %s (-id %q of group %q, its -region or %q)%s",
		ErrInvalidConfig, cfg.TLS.Cert, identities(leaf), tlsfiles.CoordinatorURI(group, cfg.ID), cfg.ID, group, tlsfiles.GlobalGroup, hint)
}

// adminCall marks the context of a call on the admin listener, so that
// rpcError points its redirects at the leader's admin address.
type adminCall struct{}

func isAdminCall(ctx context.Context) bool { return ctx.Value(adminCall{}) != nil }

// adminOnly is the admin listener's interceptor: every call on it is
// behind authorizeAdmin (a method added later cannot forget the check),
// and its redirects name admin addresses.
func (n *Node) adminOnly(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx = context.WithValue(ctx, adminCall{}, true)
	if err := n.authorizeAdmin(ctx, info.FullMethod, req); err != nil {
		return nil, n.rpcError(ctx, err)
	}
	return handler(ctx, req)
}

// adminOnlyStream is adminOnly for streams (and for calls of services the
// admin listener does not serve, which reach notServed through it).
func (n *Node) adminOnlyStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx := context.WithValue(ss.Context(), adminCall{}, true)
	if err := n.authorizeAdmin(ctx, info.FullMethod, nil); err != nil {
		return n.rpcError(ctx, err)
	}
	return handler(srv, ss)
}

// Service names, for the listeners' answers to calls they do not serve.
const (
	leasesService = "ration.v1.Leases"
	adminService  = "ration.v1.Admin"
)

// notServed answers a call of a service this listener does not serve,
// saying where it is served: an Admin call on the lease port is the
// likeliest mistake after the admin API moved to -admin.
func notServed(listener string) grpc.StreamHandler {
	return func(_ any, ss grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(ss)
		service, _, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
		switch {
		case listener == "-grpc" && service == adminService:
			return status.Errorf(codes.Unimplemented,
				"%s is not served on the lease port (-grpc): the admin API is served on the -admin listener (coordinator CLI: -addr <admin address>)", method)
		case listener == "-admin" && service == leasesService:
			return status.Errorf(codes.Unimplemented,
				"%s is not served on the admin listener (-admin): the lease API is served on the -grpc listener", method)
		}
		return status.Errorf(codes.Unimplemented, "unknown method %s on the %s listener", method, listener)
	}
}

// serverOptions are the gRPC server's credentials: mutual TLS (any
// certificate of the CA completes the handshake; each call is then
// authorized by its identity), or plaintext.
func (n *Node) serverCreds(listener string) grpc.ServerOption {
	if n.tls == nil {
		return grpc.Creds(insecure.NewCredentials())
	}
	return grpc.Creds(n.handshakeLog(listener).Credentials(n.tls.ServerCredentials(nil)))
}

// handshakeLogEvery: a listener logs at most one failed TLS handshake a
// minute (each process's rule for repeated warnings).
const handshakeLogEvery = time.Minute

// handshakeLog is the failed-handshake log of listener, made at its first
// use.
func (n *Node) handshakeLog(listener string) *tlsfiles.HandshakeLog {
	n.handshakesMu.Lock()
	defer n.handshakesMu.Unlock()
	if n.handshakes == nil {
		n.handshakes = map[string]*tlsfiles.HandshakeLog{}
	}
	h := n.handshakes[listener]
	if h == nil {
		h = tlsfiles.NewHandshakeLog(n.logger.With("component", "tls"), listener, handshakeLogEvery)
		n.handshakes[listener] = h
	}
	return h
}

// dialOptions are how this node dials the coordinators of group (-join:
// its own; -upstream: the global group): with its own certificate under
// TLS, and only to a server whose certificate names a member of that
// group, before anything (the admin token, a renewal) is sent.
func (n *Node) dialOptions(group string) []grpc.DialOption {
	if n.tls == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(n.tls.ClientCredentials("", tlsfiles.RequireCoordinator(group)))}
}

// tlsStreamLayer is the Raft transport's stream layer under TLS: mutual
// TLS both ways, and only the members of this node's group admitted
// (raftpeers.go): a peer that can append entries can rewrite every lease.
type tlsStreamLayer struct {
	lis       net.Listener
	advertise net.Addr
	src       *tlsfiles.Source
	server    *tls.Config
	peers     *raftPeers
	failed    *tlsfiles.HandshakeLog
}

// handshakeTimeout bounds a Raft connection's TLS handshake: raft reads
// an accepted connection without a deadline, so a peer that connects and
// sends nothing would otherwise hold a goroutine forever.
const handshakeTimeout = 10 * time.Second

func newTLSStreamLayer(bind string, advertise net.Addr, src *tlsfiles.Source, peers *raftPeers, failed *tlsfiles.HandshakeLog) (*tlsStreamLayer, error) {
	lis, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	l := &tlsStreamLayer{lis: lis, advertise: advertise, src: src, peers: peers, failed: failed,
		server: src.ServerConfig(tlsfiles.RequireCoordinator(peers.group))}
	if l.advertise == nil {
		l.advertise = lis.Addr()
	}
	if !advertisable(l.advertise) {
		lis.Close()
		return nil, fmt.Errorf("advertise address %v is not advertisable", l.advertise)
	}
	return l, nil
}

// namedAddr is a Raft address kept as written (host:port, the host a DNS
// name or an IP address): what the TLS stream layer advertises, so that
// peers dial, and verify the certificate against, the name.
type namedAddr string

func (a namedAddr) Network() string { return "tcp" }
func (a namedAddr) String() string  { return string(a) }

// advertisable reports whether peers can dial a: a concrete IP address, or
// a name.
func advertisable(a net.Addr) bool {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.IP != nil && !a.IP.IsUnspecified()
	case namedAddr:
		host, _, err := net.SplitHostPort(string(a))
		ip := net.ParseIP(host)
		return err == nil && host != "" && (ip == nil || !ip.IsUnspecified())
	}
	return false
}

func (l *tlsStreamLayer) Accept() (net.Conn, error) {
	c, err := l.lis.Accept()
	if err != nil {
		return nil, err
	}
	// The handshake runs on raft's goroutine for this connection (first
	// Read), not here: one slow peer must not hold up the accept loop.
	return &rpcGuard{handshakeConn: &handshakeConn{Conn: tls.Server(c, l.server), failed: l.failed}, peers: l.peers}, nil
}

func (l *tlsStreamLayer) Close() error   { return l.lis.Close() }
func (l *tlsStreamLayer) Addr() net.Addr { return l.advertise }

func (l *tlsStreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	cfg := l.src.ClientConfig(tlsfiles.HostOf(string(address)), l.peers.dialAuthorize(address))
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(address), cfg)
	if err != nil {
		return nil, fmt.Errorf("raft TLS dial %s: %w", address, err)
	}
	return c, nil
}

// handshakeConn completes the server side of the handshake, within
// handshakeTimeout, before the first Read or Write.
//
// A failed handshake is recorded in failed (at most a line a minute) and
// read as io.EOF: raft's transport would log every one as an error, and a
// client of another CA fails at every connection.
type handshakeConn struct {
	*tls.Conn
	failed *tlsfiles.HandshakeLog
	once   sync.Once
	err    error
}

func (c *handshakeConn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
		defer cancel()
		if err := c.Conn.HandshakeContext(ctx); err != nil {
			c.Conn.Close()
			if c.failed != nil {
				c.failed.Failed(c.Conn.RemoteAddr(), err)
			}
			c.err = io.EOF
		}
	})
	return c.err
}

func (c *handshakeConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *handshakeConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// warnPlaintext says at start-up that the node runs without TLS, by
// choice (-insecure or -dev: Validate refuses plaintext without either),
// and what that lets anyone who reaches its ports do.
func warnPlaintext(logger *slog.Logger, cfg Config) {
	admin := "call the admin API"
	if cfg.AdminTokenFile != "" {
		admin = "read the admin token on the wire"
	}
	logger.Warn("PLAINTEXT by -insecure or -dev: every link (lease, admin, Raft, upstream) is unencrypted and unauthenticated: anyone who reaches the ports can act as any holder, "+
		admin+" and append Raft entries; set -tls-cert, -tls-key, -tls-ca for mutual TLS (docs/security.md)",
		"insecure", cfg.Insecure, "dev", cfg.Dev, "admin_token", cfg.AdminTokenFile != "")
}
