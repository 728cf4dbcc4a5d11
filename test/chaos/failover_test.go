package chaos

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
)

// S8: Redis failover with lost writes. The replica stops replicating
// (SIGSTOP: its link delivers nothing, like a cut) for L = 1s while the
// agents keep charging the primary; then the primary is killed, the
// replica resumed, and the Sentinels promote it. Writes of the last L
// seconds are lost with the primary, so a bucket may admit up to
// B + r x (L + 1s) extra; the overshoot is measured and reported against
// that bound. The agents (given redis-sentinel://) follow the new primary
// without a restart: both admit on the store path after the failover.
//
// Protection off (RATION_CHAOS_BREAK=S8): the agents are given the
// primary's plain address instead of the Sentinels, so they cannot follow
// the promotion; the follow check fails.
func TestS8RedisFailover(t *testing.T) {
	scenario(t)
	r := rng(t)
	const rulesYAML = `
rules:
  - name: s8
    match: {s8: x}
    burst: 20
    rate: 100
`
	ss := harness.StartSentinel(t, "ration-chaos")
	redisURL := "redis-sentinel://" + strings.Join(ss.SentinelAddrs, ",") + "/" + ss.MasterName
	if broken("S8") {
		t.Log("chaos: S8 protection removed: agents get the primary's address, not the Sentinels")
		redisURL = ss.Primary.Addr
	}
	var agents []*Agent
	for i := range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s8a%d", i), Rules: rulesYAML, Redis: redisURL}))
	}
	l := StartLoad(loadOn("s8", "x", true, agents...))
	time.Sleep(2*time.Second + time.Duration(r.Int64N(int64(500*time.Millisecond))))
	lostFrom := mono()
	ss.Replica.Pause()
	time.Sleep(time.Second)
	ss.Primary.Kill()
	killed := mono()
	ss.Replica.Resume()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	newAddr, err := ss.WaitForFailover(ctx)
	if err != nil {
		l.Stop()
		t.Fatal(err)
	}
	promoted := mono()
	time.Sleep(3 * time.Second)
	calls := l.Stop()
	recs := readRecords(t, agents...)
	q := quota("s8", "x")
	lost := (killed - lostFrom).Seconds()
	bound := burst + rate*(lost+1)
	j := judgeBoth(recs, calls, nil, Spec{Quota: q, Burst: burst, Rate: rate, Bound: bound, FailClosed: true})
	var follow []string
	ok := j.Util() >= s8Util
	if !ok {
		t.Errorf("utilisation %.3f, want >= %.1f", j.Util(), s8Util)
	}
	for _, a := range agents {
		n := admittedIn(recs, q, a.ID, "store", promoted, math.MaxInt64)
		follow = append(follow, fmt.Sprintf("%s %.0f", a.ID, n))
		if n == 0 {
			ok = false
			t.Errorf("agent %s admitted nothing on the store path after %s was promoted: it did not follow", a.ID, newAddr)
		}
	}
	judgedRow(t, "S8", fmt.Sprintf("replica link cut %.1fs, primary killed, Sentinel failover", lost),
		fmt.Sprintf("B + r(L + 1s) = %.0f (L = %.1fs); utilisation >= %.1f; both agents admit on the new primary", bound, lost, s8Util), j, j.Util(), ok,
		fmt.Sprintf("failover took %v; admitted on the new primary: %s", (promoted-killed).Round(time.Millisecond), strings.Join(follow, ", ")))
}

// s8Util is S8's utilisation floor: about 9s of load of which the
// failover (primary dead until the promotion, 2-3s) admits nothing
// (fail_closed), and the lost writes let the new primary admit a little
// extra.
const s8Util = 0.5
