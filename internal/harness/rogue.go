package harness

import (
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/tlsfiles"
	"github.com/ration-dev/ration/internal/tokenfile"
)

// Rogue is a gRPC server over mutual TLS that pretends to be a coordinator
// with whatever certificate it is given (an agent's, another group's
// coordinator's): the server a client must refuse to talk to. It admits
// every client certificate of the CA and records every call that reaches
// it, with the admin token the call carried, answering each UNAVAILABLE.
type Rogue struct {
	Addr string

	conns  atomic.Int64
	mu     sync.Mutex
	calls  []string
	tokens []string
}

// StartRogue serves on a new loopback listener with the certificate in
// f, until the test ends.
func StartRogue(t testing.TB, pki *PKI, f tlsfiles.Files) *Rogue {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	r := &Rogue{Addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.Creds(pki.Source(f).ServerCredentials(nil)),
		grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
			method, _ := grpc.MethodFromServerStream(ss)
			md, _ := metadata.FromIncomingContext(ss.Context())
			r.mu.Lock()
			r.calls = append(r.calls, method)
			for _, v := range md.Get(tokenfile.MetadataKey) {
				r.tokens = append(r.tokens, v)
			}
			r.mu.Unlock()
			return status.Error(codes.Unavailable, "rogue")
		}))
	go srv.Serve(countingListener{Listener: lis, n: &r.conns})
	t.Cleanup(srv.Stop)
	return r
}

// Conns is the number of connections clients opened (each a handshake
// tried, whatever came of it).
func (r *Rogue) Conns() int64 { return r.conns.Load() }

// Calls are the methods of the calls that reached the rogue.
func (r *Rogue) Calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

// Tokens are the admin tokens (authorization metadata) calls carried.
func (r *Rogue) Tokens() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.tokens...)
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// RogueRaft serves TLS on lis with the certificate in f, in place of a
// Raft peer: it completes every handshake a client lets it complete and
// counts the bytes of application data (Raft RPCs) that follow.
type RogueRaft struct {
	conns, handshakes, bytes atomic.Int64
	mu                       sync.Mutex
	open                     []net.Conn
}

// RogueRaftClient is a Raft transport that dials over TLS with the
// certificate in f and checks nothing of the server's: a client of a
// group's Raft port that is not its member (or claims to be another).
// Its RPCs (AppendEntries, RequestVote, TimeoutNow, ...) carry whatever
// header the test writes.
func RogueRaftClient(t testing.TB, pki *PKI, f tlsfiles.Files) *raft.NetworkTransport {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	tr := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: rogueStream{Listener: lis, src: pki.Source(f)}, MaxPool: 1, Timeout: 5 * time.Second,
		Logger: hclog.NewNullLogger(),
	})
	t.Cleanup(func() { tr.CloseStreams(); tr.Close() })
	return tr
}

type rogueStream struct {
	net.Listener
	src *tlsfiles.Source
}

func (s rogueStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(address),
		s.src.ClientConfig(tlsfiles.HostOf(string(address)), nil))
}

// StartRogueRaft serves on lis until the test ends.
func StartRogueRaft(t testing.TB, pki *PKI, lis net.Listener, f tlsfiles.Files) *RogueRaft {
	t.Helper()
	r := &RogueRaft{}
	cfg := pki.Source(f).ServerConfig(nil)
	done := make(chan struct{})
	t.Cleanup(func() {
		lis.Close()
		r.mu.Lock()
		for _, c := range r.open {
			c.Close()
		}
		r.mu.Unlock()
		<-done
	})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		defer wg.Wait()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			r.conns.Add(1)
			r.mu.Lock()
			r.open = append(r.open, c)
			r.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				tc := tls.Server(c, cfg)
				if tc.Handshake() != nil {
					return
				}
				r.handshakes.Add(1)
				buf := make([]byte, 4096)
				for {
					n, err := tc.Read(buf)
					r.bytes.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return r
}

// Conns, Handshakes and Bytes count the connections accepted, the
// handshakes completed and the bytes of RPCs received.
func (r *RogueRaft) Conns() int64      { return r.conns.Load() }
func (r *RogueRaft) Handshakes() int64 { return r.handshakes.Load() }
func (r *RogueRaft) Bytes() int64      { return r.bytes.Load() }
