package chaos

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

// S2: the leader is cut from its followers (every Raft link to and from
// it blackholed; a per-link proxy tells senders apart) but stays
// reachable by the agents, which keep calling it. It cannot commit, so
// it must answer no renewal while cut (its committed-renewal counter does
// not move) and steps down; the majority elects a leader that goes on
// granting; overshoot 0. After the heal the deposed leader rejoins as a
// follower.
//
// Break: RATION_CHAOS_BREAK=S2 (splitBrain).
func TestS2DeposedLeader(t *testing.T) {
	scenario(t)
	r := rng(t)
	ids := []string{"node0", "node1", "node2"}
	var raftAddrs []string
	for range ids {
		raftAddrs = append(raftAddrs, "127.0.0.1:"+strconv.Itoa(harness.FreePort(t)))
	}
	proxies := NewLinkProxiesTLS(t, tlsfiles.GlobalGroup, ids, raftAddrs)
	coords := startCoordinators(t, 3, leasedRules, func(c *coordinator.Config) {
		i, _ := strconv.Atoi(strings.TrimPrefix(c.ID, "node"))
		c.RaftAddr, c.RaftAdvertise = raftAddrs[i], proxies[i].Addr()
	})
	redis := harness.StartRedis(t)
	var agents []*Agent
	for i := range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s2a%d", i), Rules: leasedRules,
			Redis: redis.Addr, Coordinators: splitBrain(t, "S2", i, leasedRules, joinAddrs(coords.GRPCAddrs()))}))
	}
	l := StartLoad(loadOn("closed", "x", false, agents...))
	time.Sleep(2*time.Second + time.Duration(r.Int64N(int64(500*time.Millisecond))))
	old, _ := coords.Leader(t)
	reg := coords.Registry(old)
	before := harness.Counter(t, reg, "ration_coordinator_renewals_committed_total")
	cut := mono()
	proxies[0].Isolate(ids[old])
	waitFor(t, 10*time.Second, "a new leader among the majority", func() bool {
		for _, i := range coords.Live() {
			if i != old && coords.Node(i).Ready() {
				return true
			}
		}
		return false
	})
	elected := mono()
	time.Sleep(3 * time.Second)
	during := harness.Counter(t, reg, "ration_coordinator_renewals_committed_total") - before
	stillLeader := coords.Node(old).Ready()
	for _, p := range proxies {
		p.Heal()
	}
	healed := mono()
	time.Sleep(2 * time.Second)
	calls := l.Stop()
	recs := readRecords(t, agents...)
	q := quota("closed", "x")
	j := judgeBoth(recs, calls, nil, Spec{Quota: q, Burst: burst, Rate: rate, FailClosed: true})
	granted := admittedIn(recs, q, "", "leased", elected+leasePeriod, healed)
	// A renewal committed in the instant before the cut may still be
	// counted just after it; anything more was answered without a quorum.
	ok := during <= 1 && !stillLeader && granted > 0 && j.Util() >= leasedUtil
	judgedRow(t, "S2", "leader cut from its followers, reachable by agents, 3s", fmt.Sprintf("0; the deposed leader answers nothing; utilisation >= %.1f", leasedUtil),
		j, j.Util(), ok, fmt.Sprintf("new leader after %v; renewals the deposed leader committed while cut: %.0f; the majority's leases admitted %.0f",
			(elected-cut).Round(time.Millisecond), during, granted))
	if during > 1 {
		t.Errorf("the deposed leader committed %.0f renewals while cut from its followers", during)
	}
	if stillLeader {
		t.Error("the deposed leader still says it leads after 3s cut off")
	}
	if granted == 0 {
		t.Error("no leased admission under the new leader")
	}
	if j.Util() < leasedUtil {
		t.Errorf("utilisation %.3f, want >= %.1f", j.Util(), leasedUtil)
	}
}
