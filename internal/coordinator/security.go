package coordinator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ration-dev/ration/internal/region"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

// Who may do what, when the node runs with TLS (docs/security.md). Every
// link is mutual TLS with certificates of the one CA bundle (-tls-ca); what
// a client may do follows from the identities its certificate names as URI
// SANs (tlsfiles.Role):
//
//   - the Raft transport admits only ration://coordinator/<id>, both ways:
//     an agent's certificate cannot append entries or vote;
//   - Leases calls (Renew, Release, Watch) for holder H need
//     ration://agent/ID when H is ID or ID/<incarnation> (the agent's wire
//     name), or ration://region/R when H is region/R: one agent cannot
//     renew, release or replay another's leases, nor act as a region;
//   - Admin calls need ration://operator/<name>, or
//     ration://coordinator/<id> (a node joining through -join calls AddVoter).
//
// Without TLS (-insecure, -dev) nothing is checked: every client is trusted,
// which is why that mode says so at start-up.

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

// adminRoles may call the Admin service.
var adminRoles = []tlsfiles.Role{tlsfiles.RoleOperator, tlsfiles.RoleCoordinator}

// authorizeAdmin refuses an Admin call unless the client's certificate
// names an operator or a coordinator.
func (n *Node) authorizeAdmin(ctx context.Context) error {
	if n.tls == nil {
		return nil
	}
	cert := tlsfiles.PeerCertificate(ctx)
	if cert == nil {
		return fmt.Errorf("%w: admin calls need a client certificate", ErrPermissionDenied)
	}
	if err := tlsfiles.RequireRole(adminRoles...)(cert); err != nil {
		return fmt.Errorf("%w: admin calls need an operator certificate: %w", ErrPermissionDenied, err)
	}
	return nil
}

// adminOnly is the interceptor that puts every Admin method behind
// authorizeAdmin, so that a method added later cannot forget the check.
func (n *Node) adminOnly(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if strings.HasPrefix(info.FullMethod, "/ration.v1.Admin/") {
		if err := n.authorizeAdmin(ctx); err != nil {
			return nil, n.rpcError(ctx, err)
		}
	}
	return handler(ctx, req)
}

// serverOptions are the gRPC server's credentials: mutual TLS (any
// certificate of the CA completes the handshake; each call is then
// authorized by its identity), or plaintext.
func (n *Node) serverCreds() grpc.ServerOption {
	if n.tls == nil {
		return grpc.Creds(insecure.NewCredentials())
	}
	return grpc.Creds(n.tls.ServerCredentials(nil))
}

// dialOptions are how this node dials other coordinators (-join, the
// global group from a regional one): with its own certificate under TLS.
func (n *Node) dialOptions() []grpc.DialOption {
	if n.tls == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(n.tls.ClientCredentials("", nil))}
}

// tlsStreamLayer is the Raft transport's stream layer under TLS: mutual
// TLS both ways, and only coordinator certificates admitted (a peer that
// can append entries can rewrite every lease).
type tlsStreamLayer struct {
	lis       net.Listener
	advertise net.Addr
	src       *tlsfiles.Source
	server    *tls.Config
}

// handshakeTimeout bounds a Raft connection's TLS handshake: raft reads
// an accepted connection without a deadline, so a peer that connects and
// sends nothing would otherwise hold a goroutine forever.
const handshakeTimeout = 10 * time.Second

func newTLSStreamLayer(bind string, advertise net.Addr, src *tlsfiles.Source) (*tlsStreamLayer, error) {
	lis, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	l := &tlsStreamLayer{lis: lis, advertise: advertise, src: src,
		server: src.ServerConfig(tlsfiles.RequireRole(tlsfiles.RoleCoordinator))}
	if l.advertise == nil {
		l.advertise = lis.Addr()
	}
	if a, ok := l.advertise.(*net.TCPAddr); !ok || a.IP == nil || a.IP.IsUnspecified() {
		lis.Close()
		return nil, fmt.Errorf("advertise address %v is not advertisable", l.advertise)
	}
	return l, nil
}

func (l *tlsStreamLayer) Accept() (net.Conn, error) {
	c, err := l.lis.Accept()
	if err != nil {
		return nil, err
	}
	// The handshake runs on raft's goroutine for this connection (first
	// Read), not here: one slow peer must not hold up the accept loop.
	return &handshakeConn{Conn: tls.Server(c, l.server)}, nil
}

func (l *tlsStreamLayer) Close() error   { return l.lis.Close() }
func (l *tlsStreamLayer) Addr() net.Addr { return l.advertise }

func (l *tlsStreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	cfg := l.src.ClientConfig(tlsfiles.HostOf(string(address)), tlsfiles.RequireRole(tlsfiles.RoleCoordinator))
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(address), cfg)
	if err != nil {
		return nil, fmt.Errorf("raft TLS dial %s: %w", address, err)
	}
	return c, nil
}

// handshakeConn completes the server side of the handshake, within
// handshakeTimeout, before the first Read or Write.
type handshakeConn struct {
	*tls.Conn
	once sync.Once
	err  error
}

func (c *handshakeConn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
		defer cancel()
		if c.err = c.Conn.HandshakeContext(ctx); c.err != nil {
			c.Conn.Close()
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

// warnPlaintext says at start-up that the node runs without TLS, and what
// that lets anyone who reaches its ports do. Unacknowledged plaintext
// (neither -insecure nor -dev) is an error-level line, since it may be an
// oversight: TLS is not mandatory only so that existing plaintext
// deployments keep starting.
func warnPlaintext(logger *slog.Logger, cfg Config) {
	const risk = "every link (gRPC, Raft, upstream) is unencrypted and unauthenticated: anyone who reaches the ports can act as any holder, call the admin API and append Raft entries"
	if cfg.Insecure || cfg.Dev {
		logger.Warn("PLAINTEXT by -insecure or -dev: "+risk, "insecure", cfg.Insecure, "dev", cfg.Dev)
		return
	}
	logger.Error("PLAINTEXT: no -tls-cert/-tls-key/-tls-ca and no -insecure; " + risk + ". Set the TLS files (docs/security.md), or -insecure to choose plaintext")
}
