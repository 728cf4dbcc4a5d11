package coordinator_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
	"github.com/ration-dev/ration/internal/tokenfile"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// adminState is what a refused admin call must leave as it was, read at
// the leader with the harness's own admin credentials: the tunings, and
// the Raft servers with their lease and admin addresses.
func adminState(t *testing.T, c *harness.Coordinators) string {
	t.Helper()
	ctx := timeout(t, 10*time.Second)
	admin := c.LeaderAdmin(t)
	tl, err := admin.ListTunings(ctx, &rationv1.ListTuningsRequest{})
	if err != nil {
		t.Fatalf("tunings: %v", err)
	}
	st, err := admin.Status(ctx, &rationv1.StatusRequest{})
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	var b strings.Builder
	for _, tu := range tl.Tunings {
		fmt.Fprintf(&b, "tuning %s/%s %v\n", tu.Rule, tu.Region, tu.MaxSlice != nil)
	}
	for _, sv := range st.Servers {
		fmt.Fprintf(&b, "server %s %s %s lease %s admin %s\n", sv.Id, sv.Address, sv.Suffrage, sv.GrpcAddress, sv.AdminAddress)
	}
	return b.String()
}

// adminCalls are the admin calls that change state, each as a caller that
// is refused would make it at the leader: a tuning, a voter added, a
// follower removed.
func adminCalls(c *harness.Coordinators, leader int) []struct {
	name string
	call func(context.Context, rationv1.AdminClient) error
} {
	follower := c.Config((leader + 1) % c.N()).ID
	return []struct {
		name string
		call func(context.Context, rationv1.AdminClient) error
	}{
		{"Tune", func(ctx context.Context, a rationv1.AdminClient) error {
			_, err := a.Tune(ctx, &rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "hot", MaxSlice: f64(1)}})
			return err
		}},
		{"AddVoter", func(ctx context.Context, a rationv1.AdminClient) error {
			_, err := a.AddVoter(ctx, &rationv1.AddVoterRequest{Id: "evil", RaftAddress: "127.0.0.1:1", GrpcAddress: "127.0.0.1:2", AdminAddress: "127.0.0.1:3"})
			return err
		}},
		{"RemoveServer", func(ctx context.Context, a rationv1.AdminClient) error {
			_, err := a.RemoveServer(ctx, &rationv1.RemoveServerRequest{Id: follower})
			return err
		}},
		{"Status", func(ctx context.Context, a rationv1.AdminClient) error {
			_, err := a.Status(ctx, &rationv1.StatusRequest{})
			return err
		}},
	}
}

func wantRefused(t *testing.T, what string, err error, code codes.Code, inMsg string) {
	t.Helper()
	if status.Code(err) != code {
		t.Errorf("%s: %v, want %v", what, err, code)
		return
	}
	if !strings.Contains(status.Convert(err).Message(), inMsg) {
		t.Errorf("%s: error %q does not say %q", what, err, inMsg)
	}
}

// TestAdminListener runs a 3-node group with mutual TLS and makes the admin
// calls that change state (Tune, AddVoter, RemoveServer) at the leader in
// every way but the right one: with an agent's or a region's certificate
// on the admin listener (PERMISSION_DENIED, naming the URI SAN needed), and
// with an operator's certificate on the lease port, which serves leases
// only (UNIMPLEMENTED, naming -admin). Nothing changes: the tunings and the
// members with their addresses are as they were. Then the operator's Tune
// on the admin listener goes through (the same call, the right way), and
// an operator's lease call on the admin listener is sent to -grpc.
func TestAdminListener(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 3, testRules, pki, noTicks)
	li, ln := c.Leader(t)
	ctx := timeout(t, 60*time.Second)
	if ln.AdminAddr() == ln.GRPCAddr() || ln.AdminAddr() == "" {
		t.Fatalf("admin address %q, lease address %q: want two listeners", ln.AdminAddr(), ln.GRPCAddr())
	}
	before := adminState(t, c)
	if !strings.Contains(before, "admin "+ln.AdminAddr()) {
		t.Fatalf("the leader's admin address is not in the member table:\n%s", before)
	}

	agent := harness.AdminClient(t, ln.AdminAddr(), pki.DialOptions(pki.Agent("gw-1"))...)
	region := harness.AdminClient(t, ln.AdminAddr(), pki.DialOptions(pki.Issue("eu", tlsfiles.URI(tlsfiles.RoleRegion, "eu")))...)
	opsOnLeasePort := harness.AdminClient(t, ln.GRPCAddr(), pki.DialOptions(pki.Operator("ops"))...)
	for _, tc := range adminCalls(c, li) {
		wantRefused(t, tc.name+" with an agent certificate on the admin listener", tc.call(ctx, agent),
			codes.PermissionDenied, "need an operator certificate (URI SAN ration://operator/<name>)")
		wantRefused(t, tc.name+" with a region certificate on the admin listener", tc.call(ctx, region),
			codes.PermissionDenied, "ration://operator/<name>")
		wantRefused(t, tc.name+" with an operator certificate on the lease port", tc.call(ctx, opsOnLeasePort),
			codes.Unimplemented, "the admin API is served on the -admin listener")
	}
	if after := adminState(t, c); after != before {
		t.Fatalf("refused admin calls changed the state:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// The same Tune, by an operator on the admin listener, goes through.
	ops := harness.AdminClient(t, ln.AdminAddr(), pki.DialOptions(pki.Operator("ops"))...)
	if err := adminCalls(c, li)[0].call(ctx, ops); err != nil {
		t.Fatalf("Tune by an operator on the admin listener: %v", err)
	}
	if after := adminState(t, c); !strings.Contains(after, "tuning hot/ true") {
		t.Fatalf("the operator's tuning is not in force:\n%s", after)
	}
	// A coordinator's certificate is not an operator's: a member's may add
	// itself (-join) and read Status (the members' health probes), and call
	// nothing else.
	peer := harness.AdminClient(t, ln.AdminAddr(), pki.DialOptions(pki.Member(tlsfiles.GlobalGroup, c.Config((li+1)%3).ID))...)
	if _, err := peer.Status(ctx, &rationv1.StatusRequest{}); err != nil {
		t.Fatalf("Status with a member's coordinator certificate (a health probe): %v", err)
	}
	_, err := peer.ListLeases(ctx, &rationv1.ListLeasesRequest{})
	wantRefused(t, "ListLeases with a coordinator certificate", err, codes.PermissionDenied, "may only add itself")
	// The admin listener serves no leases, and says where they are.
	cc, err := grpc.NewClient(ln.AdminAddr(), pki.DialOptions(pki.Operator("ops"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	_, err = rationv1.NewLeasesClient(cc).Renew(ctx, newHolder("ops").request(testQuotas, 1))
	wantRefused(t, "Renew on the admin listener", err, codes.Unimplemented, "the lease API is served on the -grpc listener")
}

// TestAdminToken runs a plaintext 3-node group whose nodes share an admin
// token file (the two that join send it with their AddVoter): admin calls
// without the token, or with another, are refused UNAUTHENTICATED and
// change nothing; with it they go through; and a new token written to the
// file is in force at its next read, the old one refused.
func TestAdminToken(t *testing.T) {
	file, token := harness.AdminToken(t)
	c := harness.StartCoordinators(t, 3, testRules, noTicks, func(cfg *coordinator.Config) {
		cfg.AdminTokenFile = file
		cfg.TLSReloadInterval = 50 * time.Millisecond
	})
	li, ln := c.Leader(t)
	ctx := timeout(t, 60*time.Second)
	before := adminState(t, c)

	none := harness.AdminClient(t, ln.AdminAddr())
	wrong := harness.AdminClient(t, ln.AdminAddr(), plaintext(), grpc.WithPerRPCCredentials(tokenfile.Bearer(token[1:]+"x")))
	for _, tc := range adminCalls(c, li) {
		wantRefused(t, tc.name+" without the token", tc.call(ctx, none), codes.Unauthenticated, "need the token of -admin-token-file")
		wantRefused(t, tc.name+" with another token", tc.call(ctx, wrong), codes.Unauthenticated, "does not match")
	}
	if after := adminState(t, c); after != before {
		t.Fatalf("refused admin calls changed the state:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	right := harness.AdminClient(t, ln.AdminAddr(), plaintext(), grpc.WithPerRPCCredentials(tokenfile.Bearer(token)))
	if err := adminCalls(c, li)[0].call(ctx, right); err != nil {
		t.Fatalf("Tune with the token: %v", err)
	}

	// Rotation: a new token, written over the file by a rename.
	newToken := strings.Repeat("n", tokenfile.MinLen) + "-rotated"
	tmp := filepath.Join(filepath.Dir(file), "token.new")
	if err := os.WriteFile(tmp, []byte(newToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
	rotated := harness.AdminClient(t, ln.AdminAddr(), plaintext(), grpc.WithPerRPCCredentials(tokenfile.Bearer(newToken)))
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := rotated.Status(ctx, &rationv1.StatusRequest{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new token is still refused 10s after the file changed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, err := right.Status(ctx, &rationv1.StatusRequest{})
	wantRefused(t, "Status with the old token after the rotation", err, codes.Unauthenticated, "does not match")
}

// TestAdminTokenWithTLS: with TLS and a token, an admin call needs both: an
// operator's certificate without the token is refused UNAUTHENTICATED, an
// agent's with it PERMISSION_DENIED.
func TestAdminTokenWithTLS(t *testing.T) {
	pki := harness.NewPKI(t)
	file, token := harness.AdminToken(t)
	c := harness.StartCoordinatorsTLS(t, 1, testRules, pki, noTicks, func(cfg *coordinator.Config) { cfg.AdminTokenFile = file })
	n := c.Node(0)
	ctx := timeout(t, 30*time.Second)
	bearer := grpc.WithPerRPCCredentials(tokenfile.Bearer(token))
	opsNoToken := harness.AdminClient(t, n.AdminAddr(), pki.DialOptions(pki.Operator("ops"))...)
	agentToken := harness.AdminClient(t, n.AdminAddr(), append(pki.DialOptions(pki.Agent("gw")), bearer)...)
	opsToken := harness.AdminClient(t, n.AdminAddr(), append(pki.DialOptions(pki.Operator("ops")), bearer)...)
	_, err := opsNoToken.Status(ctx, &rationv1.StatusRequest{})
	wantRefused(t, "operator certificate without the token", err, codes.Unauthenticated, "-admin-token-file")
	_, err = agentToken.Status(ctx, &rationv1.StatusRequest{})
	wantRefused(t, "agent certificate with the token", err, codes.PermissionDenied, "ration://operator/<name>")
	if _, err := opsToken.Status(ctx, &rationv1.StatusRequest{}); err != nil {
		t.Errorf("operator certificate with the token: %v", err)
	}
}

// TestLeasePortServesNoAdmin: in plaintext too, the lease port has no
// Admin service, whatever the caller.
func TestLeasePortServesNoAdmin(t *testing.T) {
	c := harness.StartCoordinators(t, 1, testRules, noTicks)
	n := c.Node(0)
	ctx := timeout(t, 30*time.Second)
	onLeasePort := harness.AdminClient(t, n.GRPCAddr())
	for _, tc := range adminCalls(c, 0)[:1] {
		wantRefused(t, tc.name+" on the lease port", tc.call(ctx, onLeasePort), codes.Unimplemented, "-admin listener")
	}
	if _, err := c.Admin(t, 0).Status(ctx, &rationv1.StatusRequest{}); err != nil {
		t.Errorf("Status on the admin listener: %v", err)
	}
	if tl, err := c.Admin(t, 0).ListTunings(ctx, &rationv1.ListTuningsRequest{}); err != nil || len(tl.Tunings) != 0 {
		t.Errorf("tunings after the refused Tune: %v, %v; want none", tl, err)
	}
	if slices.Contains(c.AdminAddrs(), n.GRPCAddr()) {
		t.Errorf("admin addresses %v include the lease port %s", c.AdminAddrs(), n.GRPCAddr())
	}
}

func plaintext() grpc.DialOption { return grpc.WithTransportCredentials(insecure.NewCredentials()) }
