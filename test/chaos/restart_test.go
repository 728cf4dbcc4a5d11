package chaos

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// leaderConn dials the coordinators' current leader.
func leaderConn(t *testing.T, coords *harness.Coordinators) *grpc.ClientConn {
	t.Helper()
	_, n := coords.Leader(t)
	// The probe renews as a holder of its own: an agent's certificate.
	conn, err := grpc.NewClient(n.GRPCAddr(), dialAs(t, tlsfiles.URI(tlsfiles.RoleAgent, "s13-probe")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// leases lists the leases in the replicated state (quota q, or all), by
// ID: each one's reclaim time (unix µs), when the leader may take it back.
func leases(t *testing.T, coords *harness.Coordinators, q string) map[uint64]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := coords.LeaderAdmin(t).ListLeases(ctx, &rationv1.ListLeasesRequest{Quota: q})
	if err != nil {
		t.Fatalf("ListLeases: %v", err)
	}
	out := map[uint64]int64{}
	for _, l := range resp.Leases {
		out[l.LeaseId] = l.ReclaimUnixUs
	}
	return out
}

func renew(t *testing.T, coords *harness.Coordinators, seq uint64) (*rationv1.RenewResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return rationv1.NewLeasesClient(leaderConn(t, coords)).Renew(ctx, &rationv1.RenewRequest{
		Holder: "s13-probe", Seq: seq, Region: "local",
		Items: []*rationv1.RenewItem{{Quota: &rationv1.QuotaRef{Rule: "held", Subject: "probe"}, Demand: 1}},
	})
}

// s13Rules are the coordinators' rules in S13: leasedRules, and a rule only
// the probe holder leases, whose lease outlives the whole scenario. The
// agents' leases (1s) may all come due while a loaded machine restarts and
// elects (then nothing of theirs is left to check); the probe's is never
// due, so the check that live leases survive the full stop always has one.
const s13Rules = leasedRules + `  - name: held
    match: {leased: held}
    burst: 1000
    rate: 100
    mode: leased
    lease: {period: 30s}
`

// S13: every coordinator restarted from its data dir and a snapshot under
// load: first one at a time (rolling, the leader among them), then all
// three at once. Overshoot 0; the leases live before the full stop are
// still there after it (ListLeases), the agents go on being granted; and
// the deduplication state survives: a probe holder's request replayed
// with its sequence number gets the recorded answer (the same lease), and
// an older sequence number is refused.
//
// Break: RATION_CHAOS_BREAK=S13 (splitBrain).
func TestS13RestartFromDisk(t *testing.T) {
	scenario(t)
	r := rng(t)
	coords := startCoordinators(t, 3, s13Rules)
	redis := harness.StartRedis(t)
	var agents []*Agent
	for i := range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s13a%d", i), Rules: leasedRules,
			Redis: redis.Addr, Coordinators: splitBrain(t, "S13", i, leasedRules, joinAddrs(coords.GRPCAddrs()))}))
	}
	l := StartLoad(loadOn("closed", "x", false, agents...))
	probe, err := renew(t, coords, 1000)
	if err != nil || len(probe.Grants) != 1 || probe.Grants[0].LeaseId == 0 {
		t.Fatalf("probe grant = %v, %v", probe, err)
	}
	time.Sleep(2*time.Second + time.Duration(r.Int64N(int64(500*time.Millisecond))))
	snapshot := func() {
		for _, i := range coords.Live() {
			if err := coords.Node(i).Raft().Snapshot().Error(); err != nil {
				t.Fatalf("snapshot node%d: %v", i, err)
			}
		}
	}
	snapshot()
	time.Sleep(500 * time.Millisecond) // entries after the snapshot, replayed from the log
	for i := range coords.N() {
		coords.Kill(i)
		coords.Restart(i)
		coords.Leader(t)
		time.Sleep(500 * time.Millisecond)
	}
	snapshot()
	time.Sleep(500 * time.Millisecond)
	q := quota("closed", "x")
	before := leases(t, coords, "")
	stopped := mono()
	for i := range coords.N() {
		coords.Kill(i)
	}
	time.Sleep(300 * time.Millisecond)
	for i := range coords.N() {
		coords.Restart(i)
	}
	coords.Leader(t)
	after := leases(t, coords, "")
	// A lease whose reclaim time has passed meanwhile may be gone, rightly
	// (an agent's may lapse while no leader was up; the probe's, on rule
	// held, does not): the ones that must still be there are those not yet
	// due.
	listed := time.Now().UnixMicro()
	var missing []uint64
	notDue := 0
	for id, reclaim := range before {
		if reclaim <= listed {
			continue
		}
		notDue++
		if _, ok := after[id]; !ok {
			missing = append(missing, id)
		}
	}
	slices.Sort(missing)
	replay, err := renew(t, coords, 1000)
	replayOK := err == nil && len(replay.Grants) == 1 && replay.Grants[0].LeaseId == probe.Grants[0].LeaseId
	_, err = renew(t, coords, 999)
	staleRefused := status.Code(err) == codes.FailedPrecondition
	time.Sleep(3 * time.Second)
	calls := l.Stop()
	recs := readRecords(t, agents...)
	j := judgeBoth(recs, calls, nil, Spec{Quota: q, Burst: burst, Rate: rate, FailClosed: true})
	granted := admittedIn(recs, q, "", "leased", stopped+leasePeriod+time.Second, math.MaxInt64)
	ok := len(missing) == 0 && notDue > 0 && replayOK && staleRefused && granted > 0 && j.Util() >= leasedUtil
	judgedRow(t, "S13", "every coordinator restarted from disk + snapshot (rolling, then all)", fmt.Sprintf("0; leases and dedup state restored; utilisation >= %.1f", leasedUtil),
		j, j.Util(), ok, fmt.Sprintf("%d/%d leases not yet due for reclaim kept across the full stop; replayed seq answered with the same lease: %v; older seq refused: %v",
			notDue-len(missing), notDue, replayOK, staleRefused))
	if notDue == 0 {
		t.Errorf("no lease before the full stop was still short of its reclaim time (before %v, listed at %d): nothing to check", before, listed)
	}
	if len(missing) > 0 {
		t.Errorf("leases %v live before the full stop are gone after it (before %v, after %v)", missing, before, after)
	}
	if !replayOK {
		t.Errorf("replayed probe request (seq 1000) = %v, %v; want the recorded grant, lease %d", replay, err, probe.Grants[0].LeaseId)
	}
	if !staleRefused {
		t.Errorf("older probe request (seq 999): err %v, want FailedPrecondition", err)
	}
	if granted == 0 {
		t.Error("no leased admission after the full restart: leases not granted again")
	}
	if j.Util() < leasedUtil {
		t.Errorf("utilisation %.3f, want >= %.1f", j.Util(), leasedUtil)
	}
}
