package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/lease"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// testRules: three leased quotas in use (hot, per-tenant|acme,
// per-tenant|globex) and one rule the coordinator must refuse to lease.
const testRules = `
rules:
  - name: hot
    match: {endpoint: hot}
    burst: 100
    rate: 10
    mode: leased
    lease: {period: 2s}
  - name: per-tenant
    match: {tenant: "*"}
    burst: 50
    rate: 5
    mode: leased
    lease: {period: 2s, min_slice: 0.5, max_slice: 4}
  - name: plain
    match: {endpoint: plain}
    burst: 10
    rate: 1
`

var testQuotas = []*rationv1.QuotaRef{
	{Rule: "hot"},
	{Rule: "per-tenant", Subject: "acme"},
	{Rule: "per-tenant", Subject: "globex"},
}

func noTicks(c *coordinator.Config) { c.TickInterval = time.Hour }

func timeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// holder plays one agent: it holds a lease per quota and renews them all
// in one request, keeping the seq contract (a request uses seq ..
// seq+len(items)-1) and retrying an uncertain request unchanged.
type holder struct {
	name   string
	seq    uint64
	leases map[string]*rationv1.Grant // by quota id
}

func newHolder(name string) *holder {
	return &holder{name: name, seq: 1, leases: map[string]*rationv1.Grant{}}
}

func qid(q *rationv1.QuotaRef) string { return coordinator.QuotaID(q.Rule, q.Subject) }

// request builds the next renewal of every quota: a grant where it holds
// nothing, else a renewal that gives back one token and confirms the sizes
// it runs at.
func (h *holder) request(quotas []*rationv1.QuotaRef, demand float64) *rationv1.RenewRequest {
	req := &rationv1.RenewRequest{Holder: h.name, Seq: h.seq}
	for _, q := range quotas {
		it := &rationv1.RenewItem{Quota: q, Demand: demand}
		if g := h.leases[qid(q)]; g != nil {
			it.LeaseId = g.LeaseId
			it.Unused = min(1, g.Cap)
			it.ConfirmedCap, it.ConfirmedRate = g.Cap, g.Rate
		}
		req.Items = append(req.Items, it)
	}
	return req
}

// adopt records the answers and advances seq past the request's numbers.
func (h *holder) adopt(req *rationv1.RenewRequest, resp *rationv1.RenewResponse) error {
	if len(resp.Grants) != len(req.Items) {
		return fmt.Errorf("%d grants for %d items", len(resp.Grants), len(req.Items))
	}
	for i, g := range resp.Grants {
		id := qid(req.Items[i].Quota)
		if g.Error != "" {
			delete(h.leases, id)
			continue
		}
		if g.LeaseId == 0 || g.DurationUs <= 0 {
			return fmt.Errorf("item %d: grant without lease id or term: %v", i, g)
		}
		h.leases[id] = g
	}
	h.seq += uint64(len(req.Items))
	return nil
}

// grantLog checks that no lease id is ever answered to two holders, or
// for two quotas.
type grantLog struct {
	mu     sync.Mutex
	owner  map[uint64]string
	errs   []error
	grants atomic.Int64
}

func (g *grantLog) record(holder string, req *rationv1.RenewRequest, resp *rationv1.RenewResponse) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, gr := range resp.Grants {
		if gr.Error != "" || gr.LeaseId == 0 {
			continue
		}
		who := holder + " " + qid(req.Items[i].Quota)
		if prev, ok := g.owner[gr.LeaseId]; ok && prev != who {
			g.errs = append(g.errs, fmt.Errorf("lease %d granted to %q and to %q", gr.LeaseId, prev, who))
		}
		g.owner[gr.LeaseId] = who
		g.grants.Add(1)
	}
}

// checkConservation checks one node's replicated state: the lease
// package's invariants, and, spelled out, pool + sum(reserved caps) <=
// burst and sum(reserved rates) <= rate for every quota (no quota is
// reconfigured in these tests, so the ceilings are B and r).
func checkConservation(n *coordinator.Node) error {
	st, idx := n.FSM().State()
	var errs []error
	if err := st.CheckInvariants(); err != nil {
		errs = append(errs, err)
	}
	for _, name := range st.Quotas() {
		q, _ := st.Quota(name)
		if q.Pool+q.ReservedCap > q.Burst*(1+1e-9) {
			errs = append(errs, fmt.Errorf("quota %s: pool %v + leased caps %v > burst %v", name, q.Pool, q.ReservedCap, q.Burst))
		}
		if q.ReservedRate > q.Rate*(1+1e-9) {
			errs = append(errs, fmt.Errorf("quota %s: leased rates %v > rate %v", name, q.ReservedRate, q.Rate))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s at index %d: %w", n.ID(), idx, err)
	}
	return nil
}

// TestLeaderKilledUnderLoad kills the leader, twice, while six holders
// renew leases on three quotas concurrently. A new leader must take over, know
// every lease the holders hold, never answer one lease id to two holders,
// and at no point may any node's state break conservation.
func TestLeaderKilledUnderLoad(t *testing.T) {
	c := harness.StartCoordinators(t, 3, testRules)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	log := &grantLog{owner: map[uint64]string{}}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		holders  []*holder
		loadErrs []error
		checkErr []error
	)
	for h := range 6 {
		hd := newHolder(fmt.Sprintf("agent-%d", h))
		holders = append(holders, hd)
		cl := c.Client(coordinator.ClientOptions{CallTimeout: 2 * time.Second, MaxAttempts: 50, BackoffMax: 200 * time.Millisecond})
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(h), 1))
			var req *rationv1.RenewRequest
			for ctx.Err() == nil {
				mu.Lock()
				if req == nil { // else: retry the uncertain request unchanged
					req = hd.request(testQuotas, 1+rng.Float64()*20)
				}
				mu.Unlock()
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				resp, err := cl.Renew(cctx, req)
				cancel()
				if err != nil {
					if ctx.Err() == nil && status.Code(err) != codes.Unavailable && status.Code(err) != codes.DeadlineExceeded {
						mu.Lock()
						loadErrs = append(loadErrs, fmt.Errorf("%s seq %d: %w", hd.name, req.Seq, err))
						mu.Unlock()
						return
					}
					continue
				}
				log.record(hd.name, req, resp)
				mu.Lock()
				err = hd.adopt(req, resp)
				mu.Unlock()
				if err != nil {
					mu.Lock()
					loadErrs = append(loadErrs, err)
					mu.Unlock()
					return
				}
				req = nil
			}
		}()
	}
	// The checker reads every node's state, including a killed node's
	// last state, throughout the run.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			for i := range c.N() {
				if n := c.Node(i); n != nil {
					if err := checkConservation(n); err != nil {
						mu.Lock()
						checkErr = append(checkErr, err)
						mu.Unlock()
					}
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	waitGrants := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for log.grants.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("load stalled: %d grants answered, want %d", log.grants.Load(), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitGrants(100)
	// Two leader changes: kill the leader, bring it back, kill the next.
	var killed []int
	var leader int
	var ln *coordinator.Node
	for round := range 2 {
		old, oldNode := c.Leader(t)
		c.Kill(old)
		killed = append(killed, old)
		t.Logf("round %d: killed leader node%d after %d grants", round, old, log.grants.Load())
		if err := checkConservation(oldNode); err != nil {
			t.Errorf("killed leader's last state: %v", err)
		}
		leader, ln = c.Leader(t)
		if leader == old {
			t.Fatalf("node%d leads again although it was killed", old)
		}
		waitGrants(log.grants.Load() + 100)
		if round == 0 {
			c.Restart(old)
		}
	}
	stop()
	wg.Wait()

	for _, err := range append(append(loadErrs, checkErr...), log.errs...) {
		t.Error(err)
	}
	// Every lease a holder holds must be known to the new leader, for
	// that holder and quota.
	list, err := harness.AdminClient(t, ln.AdminAddr()).ListLeases(timeout(t, 10*time.Second), &rationv1.ListLeasesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	known := map[uint64]*rationv1.LeaseStatus{}
	for _, l := range list.Leases {
		known[l.LeaseId] = l
	}
	held := 0
	for _, h := range holders {
		for q, g := range h.leases {
			held++
			l := known[g.LeaseId]
			switch {
			case l == nil:
				t.Errorf("%s holds lease %d on %s; the new leader node%d does not know it", h.name, g.LeaseId, q, leader)
			case l.Holder != h.name || l.Quota != q:
				t.Errorf("lease %d: held by %s on %s; the new leader has it for %s on %s", g.LeaseId, h.name, q, l.Holder, l.Quota)
			}
		}
	}
	if held == 0 {
		t.Error("no holder holds a lease at the end: the load did nothing")
	}
	// The killed node comes back and catches up to the same state.
	c.Restart(killed[1])
	c.Converged(t)
	for _, i := range c.Live() {
		if err := checkConservation(c.Node(i)); err != nil {
			t.Error(err)
		}
	}
}

// TestRestartAll stops all three nodes and starts them again on their data
// dirs: the state (quotas, leases, holder records) is rebuilt from the
// snapshot and log on disk.
func TestRestartAll(t *testing.T) {
	c := harness.StartCoordinators(t, 3, testRules, noTicks)
	cl := c.Client(coordinator.ClientOptions{})
	ctx := timeout(t, 60*time.Second)
	a, b := newHolder("agent-a"), newHolder("agent-b")
	renew := func(h *holder, quotas []*rationv1.QuotaRef) (*rationv1.RenewRequest, *rationv1.RenewResponse) {
		t.Helper()
		req := h.request(quotas, 3)
		resp, err := cl.Renew(ctx, req)
		if err != nil {
			t.Fatalf("%s: renew: %v", h.name, err)
		}
		if err := h.adopt(req, resp); err != nil {
			t.Fatal(err)
		}
		return req, resp
	}
	renew(a, testQuotas)
	renew(b, testQuotas[:2])
	// One follower snapshots mid-way, so the restart exercises both a
	// snapshot plus log suffix and a log-only replay.
	leader, _ := c.Leader(t)
	snapper := (leader + 1) % 3
	c.Converged(t)
	if err := c.Node(snapper).Raft().Snapshot().Error(); err != nil {
		t.Fatalf("snapshot node%d: %v", snapper, err)
	}
	renew(a, testQuotas)
	lastReq, lastResp := renew(b, testQuotas[:2])
	lid := b.leases[qid(testQuotas[1])].LeaseId
	if _, err := cl.Release(ctx, &rationv1.ReleaseRequest{Holder: "agent-a", Seq: a.seq,
		Items: []*rationv1.RenewItem{{LeaseId: a.leases[qid(testQuotas[2])].LeaseId, Unused: 1}}}); err != nil {
		t.Fatalf("release: %v", err)
	}
	a.seq++

	before, idx := c.Converged(t)
	pre := decodeState(t, before)
	for i := range 3 {
		c.Kill(i)
	}
	for i := range 3 {
		c.Restart(i)
	}
	if got := c.Node(snapper).FSM().Restores(); got != 1 {
		t.Errorf("node%d restored %d snapshots at start, want 1", snapper, got)
	}
	c.Leader(t)
	after, idx2 := c.Converged(t)
	if idx2 <= idx {
		t.Errorf("applied index after restart %d, want past %d (a LeaderElected entry)", idx2, idx)
	}
	post := decodeState(t, after)
	compareDurable(t, pre, post)

	// The holder records came back too: a retry of b's last request is
	// answered from the record, identically.
	resp, err := cl.Renew(ctx, lastReq)
	if err != nil {
		t.Fatalf("retry of the last request after restart: %v", err)
	}
	if !proto.Equal(resp, lastResp) {
		t.Errorf("retry after restart answered\n%v\nwant the recorded\n%v", resp, lastResp)
	}
	if _, ok := post.LeaseByID(lid); !ok {
		t.Errorf("lease %d of agent-b missing after restart", lid)
	}
	renew(a, testQuotas) // and the cluster serves
}

func decodeState(t *testing.T, b []byte) *lease.State {
	t.Helper()
	s := lease.New()
	if err := s.UnmarshalBinary(b); err != nil {
		t.Fatalf("decode state: %v", err)
	}
	return s
}

// compareDurable compares two states in everything a LeaderElected entry
// leaves alone: quota shapes, every lease's identity, holder, sizes, expiry
// and term. The pool may only have refilled.
func compareDurable(t *testing.T, pre, post *lease.State) {
	t.Helper()
	if got, want := post.Quotas(), pre.Quotas(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("quotas after restart %q, want %q", got, want)
	}
	for _, name := range pre.Quotas() {
		q0, _ := pre.Quota(name)
		q1, _ := post.Quota(name)
		if q1.QuotaConfig != q0.QuotaConfig {
			t.Errorf("quota %s: config %+v after restart, want %+v", name, q1.QuotaConfig, q0.QuotaConfig)
		}
		if q1.Pool < q0.Pool || q1.ReservedCap != q0.ReservedCap || q1.ReservedRate != q0.ReservedRate {
			t.Errorf("quota %s: pool %v, reserved (%v, %v) after restart; before: pool %v, reserved (%v, %v)",
				name, q1.Pool, q1.ReservedCap, q1.ReservedRate, q0.Pool, q0.ReservedCap, q0.ReservedRate)
		}
		l0, l1 := pre.Leases(name), post.Leases(name)
		if len(l0) != len(l1) {
			t.Errorf("quota %s: %d leases after restart, want %d", name, len(l1), len(l0))
			continue
		}
		for i := range l0 {
			if l0[i].Lease != l1[i].Lease || l0[i].Demand != l1[i].Demand {
				t.Errorf("quota %s: lease %+v after restart, want %+v", name, l1[i].Lease, l0[i].Lease)
			}
		}
	}
	if len(pre.Quotas()) == 0 {
		t.Error("no quotas before the restart: the test did nothing")
	}
}

// TestRejoinBySnapshot removes a follower, lets the log move on and
// compacts it, then adds the node back with an empty data dir: it can only
// catch up by installing the leader's snapshot. Under TLS the snapshot
// passes the Raft port's check of every RPC (raftpeers.go), which reads
// the InstallSnapshot request and hands its data on unread.
func TestRejoinBySnapshot(t *testing.T) {
	for _, tc := range []struct {
		name string
		tls  bool
	}{{"plaintext", false}, {"mutual TLS", true}} {
		t.Run(tc.name, func(t *testing.T) { testRejoinBySnapshot(t, tc.tls) })
	}
}

func testRejoinBySnapshot(t *testing.T, withTLS bool) {
	trailing := func(cfg *coordinator.Config) { cfg.TrailingLogs = 2 }
	var c *harness.Coordinators
	var cl *coordinator.Client
	if withTLS {
		pki := harness.NewPKI(t)
		c = harness.StartCoordinatorsTLS(t, 3, testRules, pki, trailing)
		cl = tlsClient(c, pki, pki.Agent("agent"))
	} else {
		c = harness.StartCoordinators(t, 3, testRules, trailing)
		cl = c.Client(coordinator.ClientOptions{})
	}
	ctx := timeout(t, 60*time.Second)
	h := newHolder("agent")
	renew := func() {
		t.Helper()
		req := h.request(testQuotas, 2)
		resp, err := cl.Renew(ctx, req)
		if err != nil {
			t.Fatalf("renew: %v", err)
		}
		if err := h.adopt(req, resp); err != nil {
			t.Fatal(err)
		}
	}
	renew()
	leader, _ := c.Leader(t)
	f := (leader + 1) % 3
	c.Remove(f)
	c.WaitVoters(t, 2)
	for range 5 {
		renew()
	}
	_, ln := c.Leader(t)
	if err := ln.Raft().Snapshot().Error(); err != nil {
		t.Fatalf("snapshot on the leader: %v", err)
	}
	if first := ln.Raft().Stats()["last_snapshot_index"]; first == "0" {
		t.Fatalf("leader's last_snapshot_index is 0 after a snapshot")
	}
	c.Add(f)
	c.WaitVoters(t, 3)
	renew()
	c.Converged(t)
	n := c.Node(f)
	if got := n.FSM().Restores(); got < 1 {
		t.Errorf("node%d restored %d snapshots, want at least 1 (installed from the leader)", f, got)
	}
	if got := n.Raft().Stats()["last_snapshot_index"]; got == "0" || got == "" {
		t.Errorf("node%d last_snapshot_index = %q, want the installed snapshot's index", f, got)
	}
	if err := checkConservation(n); err != nil {
		t.Error(err)
	}
}

// TestFollowerRedirects: a follower answers UNAVAILABLE with the leader's
// address in the trailer: its lease address for leases (on the follower's
// lease port), its admin address for membership changes and tunings (on
// the follower's admin listener); a Client given only the follower
// follows it.
func TestFollowerRedirects(t *testing.T) {
	c := harness.StartCoordinators(t, 3, testRules)
	leader, ln := c.Leader(t)
	f := (leader + 1) % 3
	fn := c.Node(f)
	admin := harness.AdminClient(t, fn.AdminAddr())
	ctx := timeout(t, 30*time.Second)
	// The follower learns the leader's address from the replicated member
	// entry, and the third member from the configuration the leader
	// replicates once it joined; wait until it has applied both.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, addr := fn.Leader(); addr == ln.GRPCAddr() {
			if _, la := fn.LeaderAdmin(); la == ln.AdminAddr() {
				if st, err := admin.Status(ctx, &rationv1.StatusRequest{}); err == nil && len(st.Servers) == 3 {
					break
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("follower never learned the leader's gRPC address and the 3 members")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cc, err := grpc.NewClient(fn.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	calls := []struct {
		name string
		call func(opt grpc.CallOption) error
		want string // the trailer
	}{
		{"Renew", func(opt grpc.CallOption) error {
			_, err := rationv1.NewLeasesClient(cc).Renew(ctx, newHolder("x").request(testQuotas, 1), opt)
			return err
		}, ln.GRPCAddr()},
		{"Release", func(opt grpc.CallOption) error {
			_, err := rationv1.NewLeasesClient(cc).Release(ctx, &rationv1.ReleaseRequest{Holder: "x", Seq: 1,
				Items: []*rationv1.RenewItem{{LeaseId: 1}}}, opt)
			return err
		}, ln.GRPCAddr()},
		{"AddVoter", func(opt grpc.CallOption) error {
			_, err := admin.AddVoter(ctx, &rationv1.AddVoterRequest{Id: "n9",
				RaftAddress: "127.0.0.1:1", GrpcAddress: "127.0.0.1:2", AdminAddress: "127.0.0.1:3"}, opt)
			return err
		}, ln.AdminAddr()},
		{"RemoveServer", func(opt grpc.CallOption) error {
			_, err := admin.RemoveServer(ctx, &rationv1.RemoveServerRequest{Id: ln.ID()}, opt)
			return err
		}, ln.AdminAddr()},
		{"Tune", func(opt grpc.CallOption) error {
			_, err := admin.Tune(ctx, &rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "hot", MaxSlice: f64(1)}}, opt)
			return err
		}, ln.AdminAddr()},
	}
	for _, tc := range calls {
		var md metadata.MD
		err := tc.call(grpc.Trailer(&md))
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s on a follower: %v, want UNAVAILABLE", tc.name, err)
		}
		if got := md.Get(coordinator.LeaderTrailer); len(got) != 1 || got[0] != tc.want {
			t.Errorf("%s on a follower: trailer %s = %q, want [%q]", tc.name, coordinator.LeaderTrailer, got, tc.want)
		}
	}
	st, err := admin.Status(ctx, &rationv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "Follower" || st.LeaderAddress != ln.GRPCAddr() || st.LeaderAdminAddress != ln.AdminAddr() || st.LeaderId != ln.ID() || len(st.Servers) != 3 {
		t.Errorf("follower status %v: want Follower, leader %s at %s (admin %s), 3 servers", st, ln.ID(), ln.GRPCAddr(), ln.AdminAddr())
	}
	// Every member's lease and admin addresses, from the member table.
	for _, sv := range st.Servers {
		var n *coordinator.Node
		for i := range c.N() {
			if c.Node(i).ID() == sv.Id {
				n = c.Node(i)
			}
		}
		if n == nil || sv.GrpcAddress != n.GRPCAddr() || sv.AdminAddress != n.AdminAddr() {
			t.Errorf("status lists server %v; want its lease and admin addresses", sv)
		}
	}

	cl := coordinator.NewClient([]string{fn.GRPCAddr()}, coordinator.ClientOptions{})
	defer cl.Close()
	h := newHolder("agent")
	req := h.request(testQuotas, 1)
	resp, err := cl.Renew(ctx, req)
	if err != nil {
		t.Fatalf("client given only a follower: %v", err)
	}
	if err := h.adopt(req, resp); err != nil {
		t.Fatal(err)
	}
	if got := cl.Leader(); got != ln.GRPCAddr() {
		t.Errorf("client talks to %q, want the leader %q", got, ln.GRPCAddr())
	}
}

// TestRenewSemantics covers the request-to-command mapping on a real
// cluster: retries are answered from the record, old sequence numbers are
// refused, rules the coordinator does not lease are refused per item, and
// malformed requests change nothing.
func TestRenewSemantics(t *testing.T) {
	c := harness.StartCoordinators(t, 3, testRules, noTicks)
	_, ln := c.Leader(t)
	cl := c.Client(coordinator.ClientOptions{})
	ctx := timeout(t, 60*time.Second)

	h := newHolder("agent")
	req := h.request(append(testQuotas, &rationv1.QuotaRef{Rule: "plain"}, &rationv1.QuotaRef{Rule: "nope"}), 2)
	resp, err := cl.Renew(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range resp.Grants {
		wantErr := i >= len(testQuotas)
		if got := strings.HasPrefix(g.Error, coordinator.ItemErrUnknownQuota); got != wantErr {
			t.Errorf("item %d (%v): error %q, want unknown quota: %v", i, req.Items[i].Quota, g.Error, wantErr)
		}
		if !wantErr && (g.LeaseId == 0 || g.Cap <= 0 || g.Rate <= 0 || g.Balance <= 0 || g.DurationUs != 2e6) {
			t.Errorf("item %d: grant %v, want a lease with cap, rate, balance and a 2s term", i, g)
		}
	}
	// A retry of an applied grant request: only the last command's answer
	// is recorded, so earlier grants say their answer was lost.
	again, err := cl.Renew(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range again.Grants[:len(testQuotas)] {
		last := i == len(testQuotas)-1
		switch {
		case last && !proto.Equal(g, resp.Grants[i]):
			t.Errorf("retry: last grant %v, want the recorded %v", g, resp.Grants[i])
		case !last && g.Error != coordinator.ItemErrRetryGrant:
			t.Errorf("retry: grant %d = %v, want error %q", i, g, coordinator.ItemErrRetryGrant)
		}
	}
	if err := h.adopt(req, resp); err != nil {
		t.Fatal(err)
	}
	// A renewal, then its retry: the same answer.
	req = h.request(testQuotas, 2)
	resp, err = cl.Renew(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	again, err = cl.Renew(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(again, resp) {
		t.Errorf("retry of a renewal answered %v, want the recorded %v", again, resp)
	}
	// An older seq is refused.
	old := proto.Clone(req).(*rationv1.RenewRequest)
	old.Seq--
	if _, err := cl.Renew(ctx, old); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("renew with an old seq: %v, want FAILED_PRECONDITION", err)
	}
	// The same seq for other items: refused, never another request's answer.
	reused := h.request(testQuotas[:1], 2)
	reused.Seq = req.Seq // a renewal-only request is one Renew command, numbered seq
	if _, err := cl.Renew(ctx, reused); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("renew reusing the last seq for other items: %v, want FAILED_PRECONDITION", err)
	}
	grantReused := &rationv1.RenewRequest{Holder: "agent-g", Seq: 1, Items: []*rationv1.RenewItem{{Quota: testQuotas[0]}}}
	if _, err := cl.Renew(ctx, grantReused); err != nil {
		t.Fatal(err)
	}
	grantReused.Items[0].Quota = testQuotas[1]
	if _, err := cl.Renew(ctx, grantReused); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("grant reusing a seq for another quota: %v, want FAILED_PRECONDITION", err)
	}
	if err := h.adopt(req, resp); err != nil {
		t.Fatal(err)
	}

	// Problems of the request itself refuse it whole; problems of one item
	// refuse that item alone (ItemErrInvalid). Neither changes the state.
	badRequests := []struct {
		name string
		req  *rationv1.RenewRequest
	}{
		{"no holder", &rationv1.RenewRequest{Seq: 100, Items: []*rationv1.RenewItem{{Quota: testQuotas[0]}}}},
		{"seq 0", &rationv1.RenewRequest{Holder: "z", Items: []*rationv1.RenewItem{{Quota: testQuotas[0]}}}},
		{"no items", &rationv1.RenewRequest{Holder: "z", Seq: 1}},
		{"seq overflows", &rationv1.RenewRequest{Holder: "z", Seq: math.MaxUint64, Items: []*rationv1.RenewItem{{Quota: testQuotas[0]}}}},
	}
	badItems := []struct {
		name string
		item *rationv1.RenewItem
	}{
		{"null item", nil},
		{"no quota", &rationv1.RenewItem{}},
		{"NaN demand", &rationv1.RenewItem{Quota: testQuotas[0], Demand: math.NaN()}},
		{"negative unused", &rationv1.RenewItem{Quota: testQuotas[0], LeaseId: 5, Unused: -1}},
		{"infinite cap", &rationv1.RenewItem{Quota: testQuotas[0], ConfirmedCap: math.Inf(1)}},
		{"subject too long", &rationv1.RenewItem{Quota: &rationv1.QuotaRef{Rule: "hot", Subject: strings.Repeat("s", 300)}}},
	}
	before, idx, err := ln.FSM().StateBinary()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range badRequests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := cl.Renew(ctx, tc.req); status.Code(err) != codes.InvalidArgument {
				t.Errorf("Renew(%s) = %v, want INVALID_ARGUMENT", tc.name, err)
			}
		})
	}
	for _, tc := range badItems {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := cl.Renew(ctx, &rationv1.RenewRequest{Holder: "z", Seq: 1, Items: []*rationv1.RenewItem{tc.item}})
			if err != nil || len(resp.Grants) != 1 || !strings.HasPrefix(resp.Grants[0].Error, coordinator.ItemErrInvalid) {
				t.Errorf("Renew(%s) = %v, %v; want one grant with error %q", tc.name, resp, err, coordinator.ItemErrInvalid)
			}
		})
	}
	rel, err := cl.Release(ctx, &rationv1.ReleaseRequest{Holder: "z", Seq: 1, Items: []*rationv1.RenewItem{{LeaseId: 0}}})
	if err != nil || len(rel.Errors) != 1 || !strings.HasPrefix(rel.Errors[0], coordinator.ItemErrInvalid) {
		t.Errorf("Release of lease 0 = %v, %v; want its item refused with %q", rel, err, coordinator.ItemErrInvalid)
	}
	after, idx2, err := ln.FSM().StateBinary()
	if err != nil {
		t.Fatal(err)
	}
	if idx2 != idx || string(after) != string(before) {
		t.Errorf("refused requests and items changed the state (index %d -> %d)", idx, idx2)
	}

	// One bad item among good ones fails alone: the others are granted.
	mixed := []struct {
		name  string
		items []*rationv1.RenewItem
		bad   int
	}{
		{"a subject past the limit", []*rationv1.RenewItem{{Quota: testQuotas[0]}, {Quota: &rationv1.QuotaRef{Rule: "hot", Subject: strings.Repeat("v", 1024)}}, {Quota: testQuotas[1]}}, 1},
		{"same quota twice", []*rationv1.RenewItem{{Quota: testQuotas[0]}, {Quota: testQuotas[0]}}, 1},
		{"a NaN demand", []*rationv1.RenewItem{{Quota: testQuotas[0], Demand: math.NaN()}, {Quota: testQuotas[1]}}, 0},
	}
	for k, tc := range mixed {
		t.Run("mixed "+tc.name, func(t *testing.T) {
			resp, err := cl.Renew(ctx, &rationv1.RenewRequest{Holder: fmt.Sprintf("mixed-%d", k), Seq: 1, Items: tc.items})
			if err != nil || len(resp.Grants) != len(tc.items) {
				t.Fatalf("Renew = %v, %v; want %d grants", resp, err, len(tc.items))
			}
			for i, g := range resp.Grants {
				switch {
				case i == tc.bad && !strings.HasPrefix(g.Error, coordinator.ItemErrInvalid):
					t.Errorf("item %d (bad) = %v, want error %q", i, g, coordinator.ItemErrInvalid)
				case i != tc.bad && (g.Error != "" || g.LeaseId == 0):
					t.Errorf("item %d (good) = %v, want a lease", i, g)
				}
			}
		})
	}
}

// TestConcurrentRenewalsShareEntries: renewals arriving together are
// committed in fewer Raft entries than requests.
func TestConcurrentRenewalsShareEntries(t *testing.T) {
	c := harness.StartCoordinators(t, 3, testRules, noTicks)
	li, _ := c.Leader(t)
	cl := c.Client(coordinator.ClientOptions{})
	ctx := timeout(t, 60*time.Second)
	const holders, rounds = 32, 5
	var wg sync.WaitGroup
	errc := make(chan error, holders)
	for i := range holders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := newHolder(fmt.Sprintf("agent-%d", i))
			for range rounds {
				req := h.request(testQuotas[:1], 1)
				resp, err := cl.Renew(ctx, req)
				if err == nil {
					err = h.adopt(req, resp)
				}
				if err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	requests, entries := batchStats(t, c.Registry(li))
	t.Logf("%v requests in %v entries", requests, entries)
	if requests < holders*rounds {
		t.Errorf("leader counted %v requests in entries, want at least %d", requests, holders*rounds)
	}
	if entries >= requests {
		t.Errorf("%v requests took %v entries: no batching", requests, entries)
	}
}

// TestLeaderElectedFirstInEveryTerm changes leaders twice (a graceful
// shutdown, which transfers leadership, then a kill) under renewals, then
// reads every node's Raft log from disk: in every term, the leader's
// first entry is its member record (lease and admin addresses) and
// LeaderElected, and LeaderElected
// appears nowhere else. Since a request is answered from its own entry's
// results, nothing was served in a term before LeaderElected was applied.
func TestLeaderElectedFirstInEveryTerm(t *testing.T) {
	c := harness.StartCoordinators(t, 3, testRules)
	cl := c.Client(coordinator.ClientOptions{MaxAttempts: 50})
	ctx := timeout(t, 60*time.Second)
	h := newHolder("agent")
	renew := func() {
		t.Helper()
		req := h.request(testQuotas, 2)
		resp, err := cl.Renew(ctx, req)
		if err != nil {
			t.Fatalf("renew: %v", err)
		}
		if err := h.adopt(req, resp); err != nil {
			t.Fatal(err)
		}
	}
	renew()
	first, _ := c.Leader(t)
	c.Shutdown(first)
	renew()
	second, _ := c.Leader(t)
	if second == first {
		t.Fatalf("node%d still leads after its shutdown", first)
	}
	c.Restart(first)
	c.Converged(t)
	c.Kill(second)
	renew()
	third, _ := c.Leader(t)
	renew()
	c.Restart(second)
	c.Converged(t)
	for i := range 3 {
		c.Kill(i)
	}
	terms := map[uint64]bool{}
	for i := range 3 {
		for term := range checkTermsOnDisk(t, filepath.Join(c.DataDir(i), "raft.db")) {
			terms[term] = true
		}
	}
	if len(terms) < 3 {
		t.Errorf("log shows %d terms with entries, want at least 3 (leaders node%d, node%d, node%d)", len(terms), first, second, third)
	}
}

// checkTermsOnDisk walks one node's log and returns the terms it saw
// commands in.
func checkTermsOnDisk(t *testing.T, path string) map[uint64]bool {
	t.Helper()
	store, err := raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bbolt.Options{ReadOnly: true, Timeout: 5 * time.Second}})
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer store.Close()
	lo, err1 := store.FirstIndex()
	hi, err2 := store.LastIndex()
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if lo != 1 {
		t.Fatalf("%s: log starts at %d; the test needs the whole log (no snapshots)", path, lo)
	}
	seen := map[uint64]bool{}
	for i := lo; i <= hi; i++ {
		var l raft.Log
		if err := store.GetLog(i, &l); err != nil {
			t.Fatalf("%s: entry %d: %v", path, i, err)
		}
		if l.Type != raft.LogCommand {
			continue
		}
		kinds, err := coordinator.EntryKinds(l.Data)
		if err != nil {
			t.Fatalf("%s: entry %d: %v", path, i, err)
		}
		elected := slices.Contains(kinds, lease.KindLeaderElected.String())
		firstInTerm := !seen[l.Term]
		seen[l.Term] = true
		if firstInTerm && !slices.Equal(kinds, []string{"member", "admin", lease.KindLeaderElected.String()}) {
			t.Errorf("%s: entry %d is the first command of term %d but holds %v, want [member admin leader-elected]", path, i, l.Term, kinds)
		}
		if !firstInTerm && elected {
			t.Errorf("%s: entry %d of term %d holds %v: LeaderElected after the term's first entry", path, i, l.Term, kinds)
		}
	}
	return seen
}
