package chaos

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

const s15Rules = `
rules:
  - name: s15
    match: {s15: leased}
    burst: 20
    rate: 100
    mode: leased
    lease: {period: 1s}
`

// s15Attempt is one answered attempt of a logical request.
type s15Attempt struct {
	start, end time.Duration
	allowed    bool
	reason     rationv1.Reason
}

// S15: request_id on the leased path. Callers send every request with an
// id and send it again: a duplicate at the same moment for one request in
// four, a first attempt whose reply is lost (a 1ms deadline) for one in
// ten, and always one more retry after the first definite answer; then
// they retry until they have a definite answer (admitted or over limit).
// Two agents, each request's attempts through one agent, offered 3r.
//
// Checks: every id is charged at most once (the logs show no second
// charging decision for an id; retries appear as replays), the charges
// equal the requests the callers saw admitted, every definite answer to
// one id agrees, and the bound B + r T holds over the logs and over what
// the callers saw (each request counted once, when its first admission
// arrived).
//
// Protection off (RATION_CHAOS_BREAK=S15): each attempt takes a fresh id,
// so a retried request can be charged twice; charges exceed the requests
// admitted.
func TestS15LeasedRequestIDs(t *testing.T) {
	scenario(t)
	r := rng(t)
	coords := startCoordinators(t, 1, s15Rules)
	redis := harness.StartRedis(t)
	fresh := broken("S15")
	if fresh {
		t.Log("chaos: S15 protection removed: every attempt takes a fresh request id")
	}
	var agents []*Agent
	for i := range 2 {
		agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s15a%d", i), Rules: s15Rules,
			Redis: redis.Addr, Coordinators: joinAddrs(coords.GRPCAddrs())}))
	}
	// The callers' random choices, drawn up front (rng is not safe for
	// concurrent use).
	const workersPerAgent, perWorker = 4, 400
	type plan struct{ concurrent, lose bool }
	plans := make([][]plan, len(agents)*workersPerAgent)
	for w := range plans {
		plans[w] = make([]plan, perWorker)
		for n := range plans[w] {
			plans[w][n] = plan{concurrent: r.Float64() < 0.25, lose: r.Float64() < 0.1}
		}
	}

	var mu sync.Mutex
	attempts := map[string][]s15Attempt{}
	var calls []Call // every attempt, for the cross-check
	firstStart := map[string]time.Duration{}
	agentOf := map[string]string{}
	send := func(ctx context.Context, a *Agent, logical, id string, timeout time.Duration) (s15Attempt, bool) {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		at := s15Attempt{start: mono()}
		resp, err := a.Client.Allow(cctx, &rationv1.AllowRequest{Rule: "s15", Subject: "x", RequestId: id})
		at.end = mono()
		c := Call{Start: at.start, End: at.end, RequestID: id, AgentID: a.ID, Rule: "s15", Subj: "x", Err: err}
		if err != nil {
			mu.Lock()
			calls = append(calls, c)
			mu.Unlock()
			return at, false
		}
		at.allowed, at.reason = resp.Allowed, resp.Reason
		c.Allowed, c.Reason = resp.Allowed, resp.Reason
		mu.Lock()
		attempts[logical] = append(attempts[logical], at)
		calls = append(calls, c)
		mu.Unlock()
		return at, at.reason == rationv1.Reason_REASON_OK || at.reason == rationv1.Reason_REASON_OVER_LIMIT
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := 6 * time.Second
	deadline := time.Now().Add(run)
	// Each worker offers offered/(all workers) requests per second.
	pace := time.Duration(float64(time.Second) * float64(len(plans)) / offered)
	var wg sync.WaitGroup
	for w := range plans {
		a := agents[w%len(agents)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := time.Now()
			for n := 0; n < perWorker && time.Now().Before(deadline); n++ {
				time.Sleep(time.Until(next))
				next = next.Add(pace)
				p := plans[w][n]
				logical := fmt.Sprintf("s15-%d-%d-%d", seedValue%100000, w, n)
				try := 0
				id := func() string {
					if !fresh {
						return logical
					}
					try++
					return fmt.Sprintf("%s-try%d", logical, try)
				}
				mu.Lock()
				firstStart[logical] = mono()
				agentOf[logical] = a.ID
				mu.Unlock()
				var pair sync.WaitGroup
				if p.concurrent {
					pid := logical
					if fresh {
						pid = logical + "-pair"
					}
					pair.Add(1)
					go func() { defer pair.Done(); send(ctx, a, logical, pid, 2*time.Second) }()
				}
				timeout := 2 * time.Second
				if p.lose {
					timeout = time.Millisecond
				}
				_, definite := send(ctx, a, logical, id(), timeout)
				pair.Wait()
				// One deliberate retry after the answer, then until definite.
				_, again := send(ctx, a, logical, id(), 2*time.Second)
				definite = definite || again
				for retry := 0; !definite && retry < 10; retry++ {
					time.Sleep(5 * time.Millisecond)
					_, definite = send(ctx, a, logical, id(), 2*time.Second)
				}
			}
		}()
	}
	wg.Wait()
	recs := readRecords(t, agents...)

	q := quota("s15", "x")
	// The logs: charging decisions per id (replays excluded), and replays.
	charges := map[string]int{}
	var charged, replays int
	for _, rec := range recs {
		if rec.Quota != q {
			continue
		}
		switch {
		case rec.Path == "replay":
			replays++
		case rec.Allowed:
			charged++
			charges[strings.TrimSuffix(rec.RequestID, "-pair")]++
		}
	}
	var twice []string
	for id, n := range charges {
		if n > 1 {
			twice = append(twice, fmt.Sprintf("%s x%d", id, n))
		}
	}
	sort.Strings(twice)
	// The callers: each logical request admitted or not, answers agreeing.
	var obs []observation
	var disagree []string
	var undecided, admittedLogical int
	for logical, ats := range attempts {
		o := observation{ID: logical, Start: firstStart[logical], Cost: 1, Quota: q, Burst: burst, Rate: rate,
			AgentID: agentOf[logical], AttemptCount: len(ats)}
		var verdicts []bool
		for _, at := range ats {
			if at.reason != rationv1.Reason_REASON_OK && at.reason != rationv1.Reason_REASON_OVER_LIMIT {
				continue
			}
			verdicts = append(verdicts, at.allowed)
			if at.allowed && (!o.Allowed || at.end < o.End) {
				o.Allowed, o.End = true, at.end
			}
		}
		if len(verdicts) == 0 {
			undecided++
		}
		for _, v := range verdicts[min(1, len(verdicts)):] {
			if v != verdicts[0] {
				disagree = append(disagree, logical)
				break
			}
		}
		if o.Allowed {
			admittedLogical++
		}
		obs = append(obs, o)
	}
	sort.Strings(disagree)
	j := judgeBoth(recs, calls, obs, Spec{Quota: q, Burst: burst, Rate: rate, FailClosed: true})
	ok := len(twice) == 0 && len(disagree) == 0 && replays > 0 && j.Util() >= leasedUtil &&
		charged >= admittedLogical && charged <= admittedLogical+undecided
	judgedRow(t, "S15", "leased rule, every request retried with its id (25% concurrent duplicates, 10% replies lost)",
		fmt.Sprintf("0; each id charged once; utilisation >= %.1f", leasedUtil), j, j.Util(), ok,
		fmt.Sprintf("%d requests, %d admitted, %d charges, %d replays, %d ids charged twice, %d with disagreeing answers, %d undecided",
			len(attempts), admittedLogical, charged, replays, len(twice), len(disagree), undecided))
	if len(twice) > 0 {
		t.Errorf("%d ids charged more than once: %v", len(twice), twice[:min(10, len(twice))])
	}
	if charged < admittedLogical || charged > admittedLogical+undecided {
		t.Errorf("%d charges for %d requests admitted (%d undecided): a retried request was charged again", charged, admittedLogical, undecided)
	}
	if len(disagree) > 0 {
		t.Errorf("%d requests got different definite answers to the same id: %v", len(disagree), disagree[:min(10, len(disagree))])
	}
	if replays == 0 {
		t.Errorf("no replay in the logs: the retries were not answered from the agents' records")
	}
	if j.Util() < leasedUtil {
		t.Errorf("utilisation %.3f, want >= %.1f", j.Util(), leasedUtil)
	}
}
