package coordinator_test

import (
	"crypto/tls"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/certgen"
	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// tlsClient is a coordinator client presenting the certificate in f.
func tlsClient(c *harness.Coordinators, pki *harness.PKI, f tlsfiles.Files) *coordinator.Client {
	return c.Client(coordinator.ClientOptions{DialOptions: pki.DialOptions(f), MaxAttempts: 20})
}

// leasesOf lists the live leases of holder, as the leader knows them.
func leasesOf(t *testing.T, admin rationv1.AdminClient, holder string) map[uint64]*rationv1.LeaseStatus {
	t.Helper()
	resp, err := admin.ListLeases(timeout(t, 10*time.Second), &rationv1.ListLeasesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64]*rationv1.LeaseStatus{}
	for _, l := range resp.Leases {
		if l.Holder == holder {
			out[l.LeaseId] = l
		}
	}
	return out
}

func adminWith(t *testing.T, addr string, opts []grpc.DialOption) rationv1.AdminClient {
	t.Helper()
	return harness.AdminClient(t, addr, opts...)
}

// TestIdentityIsTheCertificate runs a 3-node group with mutual TLS on
// every link. Alice holds leases; Mallory, with a valid agent certificate
// of her own, tries to renew, release, watch and lock out Alice's leases,
// and to act as a region: every call is refused PERMISSION_DENIED and
// Alice's leases and sequence numbers are untouched.
func TestIdentityIsTheCertificate(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 3, testRules, pki, noTicks)
	_, ln := c.Leader(t)
	alice := tlsClient(c, pki, pki.Agent("alice"))
	mallory := tlsClient(c, pki, pki.Agent("mallory"))
	ops := adminWith(t, ln.AdminAddr(), pki.DialOptions(pki.Operator("ops")))
	ctx := timeout(t, 60*time.Second)

	h := newHolder("alice")
	req := h.request(testQuotas, 1)
	resp, err := alice.Renew(ctx, req)
	if err != nil {
		t.Fatalf("alice renews her own leases: %v", err)
	}
	if err := h.adopt(req, resp); err != nil {
		t.Fatal(err)
	}
	before := leasesOf(t, ops, "alice")
	if len(before) != len(testQuotas) {
		t.Fatalf("alice holds %d leases, want %d", len(before), len(testQuotas))
	}
	var someLease uint64
	for id := range before {
		someLease = id
	}

	denied := func(what string, err error, wantInMsg string) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: %v, want PERMISSION_DENIED", what, err)
			return
		}
		if !strings.Contains(err.Error(), wantInMsg) {
			t.Errorf("%s: error %q does not say %q", what, err, wantInMsg)
		}
	}
	// Renew Alice's leases, with a sequence number far ahead (it would
	// lock her out: her next requests would all be stale).
	steal := h.request(testQuotas, 1)
	steal.Seq = 1 << 60
	_, err = mallory.Renew(ctx, steal)
	denied("mallory renews alice's leases", err, `holder "alice" is not this client's`)
	// Release one (the pool would get back tokens Alice keeps spending).
	_, err = mallory.Release(ctx, &rationv1.ReleaseRequest{Holder: "alice", Seq: 1 << 60,
		Items: []*rationv1.RenewItem{{LeaseId: someLease, Unused: 1}}})
	denied("mallory releases alice's lease", err, `holder "alice" is not this client's`)
	// The same, under one of Alice's incarnations (the agent's wire name is
	// <id>/<incarnation>).
	_, err = mallory.Renew(ctx, &rationv1.RenewRequest{Holder: "alice/1234", Seq: 1,
		Items: []*rationv1.RenewItem{{Quota: testQuotas[0], Demand: 1}}})
	denied("mallory renews as an incarnation of alice", err, `holder "alice/1234" is not this client's`)
	// Act as a region of the global group.
	_, err = mallory.Renew(ctx, &rationv1.RenewRequest{Holder: "region/eu", Region: "eu", Seq: 1,
		Items: []*rationv1.RenewItem{{Quota: testQuotas[0], Demand: 1}}})
	denied("mallory acts as region eu", err, "region")
	// Watch Alice's nudges (and replace her stream).
	cc, err := grpc.NewClient(ln.GRPCAddr(), pki.DialOptions(pki.Agent("mallory2"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ws, err := rationv1.NewLeasesClient(cc).Watch(ctx, &rationv1.WatchRequest{Holder: "alice"})
	if err == nil {
		_, err = ws.Recv()
	}
	denied("mallory watches alice", err, `holder "alice"`)
	// The admin API is not an agent's (TestAdminListener has more).
	ag := adminWith(t, ln.AdminAddr(), pki.DialOptions(pki.Agent("mallory3")))
	_, err = ag.Tune(ctx, &rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "hot", MaxSlice: f64(1)}})
	denied("an agent tunes", err, "operator certificate")
	_, err = ag.RemoveServer(ctx, &rationv1.RemoveServerRequest{Id: ln.ID()})
	denied("an agent removes the leader", err, "operator certificate")
	_, err = ag.AddVoter(ctx, &rationv1.AddVoterRequest{Id: "evil", RaftAddress: "127.0.0.1:1", GrpcAddress: "127.0.0.1:2", AdminAddress: "127.0.0.1:3"})
	denied("an agent adds a voter", err, "operator certificate")
	_, err = ag.Status(ctx, &rationv1.StatusRequest{})
	denied("an agent reads the status", err, "operator certificate")

	// Nothing changed: Alice's leases are all there, with their terms, the
	// group still has its three voters and no tuning, and Alice's next
	// renewal, numbered after her own last, is accepted (no lockout).
	after := leasesOf(t, ops, "alice")
	if len(after) != len(before) {
		t.Fatalf("alice holds %d leases after the attempts, want %d", len(after), len(before))
	}
	for id, l := range before {
		if a := after[id]; a == nil || a.Cap != l.Cap || a.ExpiryUnixUs != l.ExpiryUnixUs {
			t.Errorf("lease %d changed: %v -> %v", id, l, a)
		}
	}
	if tl, err := ops.ListTunings(ctx, &rationv1.ListTuningsRequest{}); err != nil || len(tl.Tunings) != 0 {
		t.Errorf("tunings after the refused Tune: %v, %v; want none", tl, err)
	}
	if st, err := ops.Status(ctx, &rationv1.StatusRequest{}); err != nil || len(st.Servers) != 3 {
		t.Errorf("operator's status: %v, %v; want 3 servers", st, err)
	}
	req = h.request(testQuotas, 1)
	resp, err = alice.Renew(ctx, req)
	if err != nil {
		t.Fatalf("alice's next renewal: %v", err)
	}
	if _, err := alice.Renew(ctx, newHolder("alice/restarted").request(testQuotas[:1], 1)); err != nil {
		t.Errorf("a new incarnation of alice, with alice's certificate: %v", err)
	}
	for i, g := range resp.Grants {
		if g.Error != "" || g.LeaseId != req.Items[i].LeaseId {
			t.Errorf("alice's renewal of %v: %v, want her lease %d renewed", req.Items[i].Quota, g, req.Items[i].LeaseId)
		}
	}
}

// TestTLSRefusesStrangers: a client without a certificate, or with one of
// another CA, does not get a call through; and the Raft port's handshake
// admits only certificates of its group's coordinators (an agent's cannot
// even complete one, let alone append an entry; what a member of the group
// may send is TestRaftPortAdmitsOnlyMembers's).
func TestTLSRefusesStrangers(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 1, testRules, pki, noTicks)
	n := c.Node(0)
	ctx := timeout(t, 30*time.Second)

	plain := adminWith(t, n.AdminAddr(), []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())})
	if _, err := plain.Status(ctx, &rationv1.StatusRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext Status: %v, want UNAVAILABLE (no TLS handshake)", err)
	}
	other := harness.NewPKI(t)
	stranger := adminWith(t, n.AdminAddr(), other.DialOptions(other.Operator("ops")))
	if _, err := stranger.Status(ctx, &rationv1.StatusRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("Status with another CA's operator certificate: %v, want UNAVAILABLE", err)
	}

	for _, tc := range []struct {
		name string
		f    tlsfiles.Files
		ok   bool
	}{
		{"agent", pki.Agent("a1"), false},
		{"operator", pki.Operator("ops"), false},
		{"coordinator", pki.Member(tlsfiles.GlobalGroup, "peer"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := pki.Source(tc.f)
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", n.RaftAddr(),
				src.ClientConfig("127.0.0.1", nil))
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer conn.Close()
			// Send nothing and wait: an admitted peer's connection stays
			// open (raft waits for a command), a refused one is closed with
			// a TLS alert once the server has judged the certificate.
			conn.SetReadDeadline(time.Now().Add(time.Second))
			_, err = conn.Read(make([]byte, 1))
			switch {
			case tc.ok && !isTimeout(err):
				t.Fatalf("coordinator certificate refused by the Raft port: %v", err)
			case !tc.ok && (err == nil || isTimeout(err)):
				t.Fatalf("%s certificate admitted to the Raft port (read: %v)", tc.name, err)
			}
		})
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestTLSRotationDropsNoRenewal re-issues every node's certificate (same
// CA) while a holder renews without pause: the nodes reload their files,
// Raft and client connections carry on, and no renewal fails.
func TestTLSRotationDropsNoRenewal(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 3, testRules, pki, noTicks)
	_, ln := c.Leader(t)
	cl := tlsClient(c, pki, pki.Agent("alice"))
	ctx := timeout(t, 60*time.Second)
	h := newHolder("alice")
	var renewals, failures atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			req := h.request(testQuotas, 1)
			resp, err := cl.Renew(ctx, req)
			if err == nil {
				err = h.adopt(req, resp)
			}
			if err != nil {
				failures.Add(1)
				firstErr.CompareAndSwap(nil, err)
				continue
			}
			renewals.Add(1)
		}
	}()
	time.Sleep(300 * time.Millisecond)
	// Re-issue the leader's serving certificate in place; new connections
	// to it must see the new serial number.
	serial := servedSerial(t, ln.GRPCAddr(), pki)
	for i := range c.N() {
		pki.Reissue(c.Config(i).TLS, "coordinator-"+c.Node(i).ID(), tlsfiles.CoordinatorURI(tlsfiles.GlobalGroup, c.Node(i).ID()))
	}
	deadline := time.Now().Add(10 * time.Second)
	for servedSerial(t, ln.GRPCAddr(), pki) == serial {
		if time.Now().After(deadline) {
			t.Fatal("the leader still serves its old certificate 10s after the files changed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Raft connections are dialed again after a leader change: force one,
	// so the new certificates are exercised between the nodes too.
	if err := ln.Raft().LeadershipTransfer().Error(); err != nil {
		t.Fatalf("leadership transfer over the rotated certificates: %v", err)
	}
	// Renewals go on at the new leader, over new connections.
	atTransfer := renewals.Load()
	deadline = time.Now().Add(20 * time.Second)
	for renewals.Load() < atTransfer+5 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	<-done
	if failures.Load() != 0 {
		t.Fatalf("%d of %d renewals failed across the rotation; first: %v", failures.Load(), renewals.Load()+failures.Load(), firstErr.Load())
	}
	if renewals.Load() < atTransfer+5 {
		t.Fatalf("%d renewals after the leadership transfer, want at least 5", renewals.Load()-atTransfer)
	}
	t.Logf("%d renewals across the rotation, none failed", renewals.Load())
}

// servedSerial is the serial number of the certificate addr serves, seen
// by an operator's handshake.
func servedSerial(t *testing.T, addr string, pki *harness.PKI) string {
	t.Helper()
	src := pki.Source(pki.Operator("probe"))
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, src.ClientConfig("127.0.0.1", nil))
	if err != nil {
		t.Fatalf("probe %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestRegionOverMutualTLS: a regional group leases from the global group
// over mutual TLS as region/eu, with its nodes' certificates naming
// ration://region/eu; a regional group whose certificates name no region
// is refused by the global group and holds no upstream lease.
func TestRegionOverMutualTLS(t *testing.T) {
	pki := harness.NewPKI(t)
	global := harness.StartCoordinatorsTLS(t, 1, hierRules, pki, noTicks)
	up := strings.Join(global.GRPCAddrs(), ",")
	eu := harness.StartCoordinatorsTLS(t, 1, hierRules, pki, func(c *coordinator.Config) {
		c.Region, c.Upstream = "eu", up
	})
	us := harness.StartCoordinators(t, 1, hierRules, func(c *coordinator.Config) {
		c.Region, c.Upstream = "us", up
		pki.Coordinator(c)
		// A coordinator certificate without ration://region/us.
		c.TLS = pki.Member("us", c.ID)
	})
	ops := adminWith(t, global.Node(0).AdminAddr(), pki.DialOptions(pki.Operator("ops")))
	ctx := timeout(t, 60*time.Second)
	renew := func(c *harness.Coordinators, h *holder) {
		t.Helper()
		cl := tlsClient(c, pki, pki.Agent(h.name))
		req := h.request([]*rationv1.QuotaRef{{Rule: "g", Subject: "x"}}, 40)
		resp, err := cl.Renew(ctx, req)
		if err != nil {
			t.Fatalf("%s renews at its region: %v", h.name, err)
		}
		if err := h.adopt(req, resp); err != nil {
			t.Fatal(err)
		}
	}
	ha, hb := newHolder("eu-agent"), newHolder("us-agent")
	deadline := time.Now().Add(20 * time.Second)
	for len(leasesOf(t, ops, "region/eu")) == 0 {
		renew(eu, ha)
		renew(us, hb)
		if time.Now().After(deadline) {
			t.Fatal("region eu never held a lease of the global group over mutual TLS")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// us has asked as often as eu by now, and kept asking: refused each time.
	for range 5 {
		renew(us, hb)
		time.Sleep(100 * time.Millisecond)
	}
	if l := leasesOf(t, ops, "region/us"); len(l) != 0 {
		t.Fatalf("region us holds %d global leases with a certificate naming no region", len(l))
	}
}

// TestRaftAdvertiseNameUnderTLS: under TLS a -raft-advertise host name is
// kept as a name (not resolved to an IP address once, at start): the Raft
// configuration holds it, and the leader dials it and verifies the
// follower's certificate against it, which names DNS localhost and no IP
// address of the follower's own (a StatefulSet pod's certificate names
// its Service's DNS name, never the Service's cluster IP).
func TestRaftAdvertiseNameUnderTLS(t *testing.T) {
	pki := harness.NewPKI(t)
	port := harness.FreePort(t)
	named := "localhost:" + strconv.Itoa(port)
	c := harness.StartCoordinatorsTLS(t, 2, testRules, pki, noTicks, func(cfg *coordinator.Config) {
		if cfg.ID == "node1" {
			cfg.RaftAddr, cfg.RaftAdvertise = "127.0.0.1:"+strconv.Itoa(port), named
		}
	}, func(cfg *coordinator.Config) {
		// After pki.Coordinator: node1's certificate names DNS localhost
		// only, so a dial of 127.0.0.1 could not verify it.
		if cfg.ID == "node1" {
			paths, err := pki.CA.WriteFiles(t.TempDir(), "tls", certgen.Request{
				CommonName: "node1", URIs: []string{tlsfiles.CoordinatorURI(tlsfiles.GlobalGroup, "node1")}, DNSNames: []string{"localhost"},
			})
			if err != nil {
				t.Fatal(err)
			}
			cfg.TLS = tlsfiles.Files{Cert: paths.Cert, Key: paths.Key, CA: paths.CA}
		}
	})
	_, ln := c.Leader(t)
	if ln.ID() != "node0" {
		t.Fatalf("%s leads, want node0 (it bootstrapped)", ln.ID())
	}
	servers, err := ln.Raft().GetConfiguration().Configuration().Servers, ln.Raft().GetConfiguration().Error()
	if err != nil {
		t.Fatal(err)
	}
	var got string
	for _, s := range servers {
		if s.ID == "node1" {
			got = string(s.Address)
		}
	}
	if got != named {
		t.Fatalf("node1's Raft address in the configuration is %q, want %q (the name it advertises)", got, named)
	}
	// node1 applies what the leader commits over that connection.
	cl := tlsClient(c, pki, pki.Agent("alice"))
	h := newHolder("alice")
	req := h.request(testQuotas, 1)
	if _, err := cl.Renew(timeout(t, 30*time.Second), req); err != nil {
		t.Fatal(err)
	}
	c.Converged(t)
}
