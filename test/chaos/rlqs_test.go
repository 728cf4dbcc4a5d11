package chaos

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/harness"
)

// S21's quota: Envoys on RLQS decide every request themselves on token
// bucket assignments the agents lend out of their leases. Its burst is
// larger than the suite's (B = 20): an assignment prepays its burst plus
// its refill over its TTL and the delivery margin, so a lease of a few
// tokens funds none (docs/integrations/envoy-rlqs.md, Limits). The rate is
// the suite's, offered 3r.
const (
	s21Burst  = 100.0
	s21Rate   = 100.0
	s21Period = 2 * time.Second
	// s21Util is the utilisation floor (admitted over B + r T, T the span
	// of the admissions): low, as every assignment prepays its refill over
	// its TTL from a lease's share (measured 0.33 to 0.49); below it the
	// agents funded far less than they can.
	s21Util = 0.2
	// s21Clients is the number of Envoys (RLQS streams) per agent; the
	// suite's offered load (3r) is split over all of them.
	s21Clients = 3
)

var s21Rules = fmt.Sprintf(`
rules:
  - name: s21
    match: {domain: edge, s21: "*"}
    burst: %g
    rate: %g
    mode: leased
    on_failure: fail_closed
    lease: {period: %v}
`, s21Burst, s21Rate, s21Period)

// rlqsLoad is S21's Envoys: s21Clients filter-like RLQS clients
// (harness.RLQSClient) per agent, each offering its share of 3r on one
// bucket, every admission stamped with mono() when the client made it.
type rlqsLoad struct {
	mu   sync.Mutex
	recs []admission.Record
	stop chan struct{}
	wg   sync.WaitGroup
	cls  []*harness.RLQSClient
}

func startRLQSLoad(t *testing.T, agents []*Agent, q string) *rlqsLoad {
	t.Helper()
	l := &rlqsLoad{stop: make(chan struct{})}
	every := time.Duration(float64(time.Second) * float64(len(agents)*s21Clients) / offered)
	id := map[string]string{"s21": "a"}
	for _, a := range agents {
		for range s21Clients {
			agent := "client/" + a.ID
			cl := harness.DialRLQS(t, a.GRPC, "edge", 500*time.Millisecond, func() {
				at := mono()
				l.mu.Lock()
				l.recs = append(l.recs, admission.Record{At: at, Agent: agent, Quota: q, Cost: 1,
					Allowed: true, Path: "client", Burst: s21Burst, Rate: s21Rate})
				l.mu.Unlock()
			})
			l.cls = append(l.cls, cl)
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				tk := time.NewTicker(every)
				defer tk.Stop()
				for n := 0; n < int(maxScenarioLoad/every); n++ {
					select {
					case <-l.stop:
						return
					case <-tk.C:
					}
					cl.Request(id)
				}
			}()
		}
	}
	t.Cleanup(func() { l.Stop() })
	return l
}

// Stop ends the load (once) and returns every admission, in time order.
func (l *rlqsLoad) Stop() []admission.Record {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	recs := append([]admission.Record(nil), l.recs...)
	admission.Sort(recs)
	return recs
}

// Err is the first stream error of any client.
func (l *rlqsLoad) Err() error {
	for _, cl := range l.cls {
		if err := cl.Err(); err != nil {
			return err
		}
	}
	return nil
}

// rlqsJudged is S21's two judges on one quota.
//
// The clients: every admission the Envoys made, each at the instant it
// was made (a filter decides locally: no latency to widen a window),
// replayed through admission.Check against B + r T.
//
// The agents: an agent makes no per-request decision on RLQS, so its side
// is its ledger of loans (/metrics): every token bucket assignment's
// max_tokens is lent out of a lease before it is sent, its tokens_per_fill
// out of the lease's own refill while it lasts, and only what Envoy
// provably never spent goes back. So for each agent the admissions its
// Envoys made must be covered by what it lent and kept: admitted <=
// reserved - returned + the rate lent integrated over its time. An agent whose Envoys spent tokens it never lent (an
// assignment sent unfunded, or a return of tokens that were spent) fails
// here whatever the clients' judge says.
type rlqsJudged struct {
	Client   admission.Verdict
	Admitted map[string]float64 // by agent id, as its clients saw it
	Kept     map[string]float64 // by agent id: reserved - returned + rate tokens
	Problems []string
}

func judgeRLQS(t *testing.T, recs []admission.Record, agents []*Agent, q string) rlqsJudged {
	t.Helper()
	j := rlqsJudged{Admitted: map[string]float64{}, Kept: map[string]float64{}}
	j.Client = admission.Judge(admission.Check(recs, q, s21Burst, s21Rate), 0)
	if !j.Client.Pass {
		j.Problems = append(j.Problems, fmt.Sprintf("clients: overshoot %.3f over B + r T (window [%v, %v] after the first admission)",
			j.Client.Certain.Overshoot, j.Client.Certain.From-j.Client.First, j.Client.Certain.To-j.Client.First))
	}
	for _, r := range recs {
		j.Admitted[r.Agent[len("client/"):]] += r.Cost
	}
	for _, a := range agents {
		lent, ok1, err1 := scrapeMetric(a.HTTP, "ration_rlqs_tokens_reserved_total")
		back, ok2, err2 := scrapeMetric(a.HTTP, "ration_rlqs_tokens_returned_total")
		refill, ok3, err3 := scrapeMetric(a.HTTP, "ration_rlqs_rate_tokens_total")
		if err1 != nil || err2 != nil || err3 != nil || !ok1 || !ok2 || !ok3 {
			t.Fatalf("chaos: agent %s's RLQS ledger: %v %v %v (found %v %v %v)", a.ID, err1, err2, err3, ok1, ok2, ok3)
		}
		// Lent as tokens (max_tokens) and kept, plus what the rate lent
		// (tokens_per_fill) could refill while it was lent.
		j.Kept[a.ID] = lent - back + refill
		if adm := j.Admitted[a.ID]; adm > j.Kept[a.ID]+admission.Tolerance {
			j.Problems = append(j.Problems, fmt.Sprintf("agent %s: its Envoys admitted %.0f, more than it lent and kept (%.1f reserved - %.1f returned + %.1f refilled at the rate lent)",
				a.ID, adm, lent, back, refill))
		}
	}
	return j
}

func (j rlqsJudged) note() string {
	s := fmt.Sprintf("clients: admitted %.0f, overshoot %.2f (exact times), utilisation %.3f; ledger (admitted / lent and kept):",
		j.Client.Admitted, j.Client.Certain.Overshoot, j.Client.Utilisation)
	for _, id := range slices.Sorted(maps.Keys(j.Kept)) {
		s += fmt.Sprintf(" %s %.0f / %.0f", id, j.Admitted[id], j.Kept[id])
	}
	return s
}

func admittedBy(recs []admission.Record, agent string, from, to time.Duration) float64 {
	var n float64
	for _, r := range recs {
		if (agent == "" || r.Agent == "client/"+agent) && r.At >= from && r.At < to {
			n += r.Cost
		}
	}
	return n
}

// S21: Envoys on RLQS (filter-like clients deciding on token bucket
// assignments, harness.RLQSClient), 2 agents with 3 streams each on one
// leased fail_closed quota, through two faults, each judged by both
// judges of rlqsJudged (the clients' admissions against B + r T; each
// agent's ledger of loans against its clients' admissions):
//
//   - leader: the Raft leader process SIGKILLed under load, restarted 2s
//     later; assignments are funded again after the election.
//   - cut: one agent cut from its coordinator (both directions
//     blackholed) for 3 lease periods: its Envoys admit nothing from D
//     after the cut (an assignment ends before the lease it is lent from)
//     until the heal, and are funded again after it.
//
// Break: RATION_CHAOS_BREAK=S21 builds the agents with a lease that
// lends without taking the tokens out of its balance (codeBreaks): every
// assignment is sent unfunded, so each Envoy spends the lease again; both
// rows must fail.
func TestS21RLQSThroughFaults(t *testing.T) {
	scenario(t)
	r := rng(t)
	q := quota("s21", "")
	t.Run("leader", func(t *testing.T) {
		coords := StartCoordinatorProcs(t, 3, s21Rules)
		redis := harness.StartRedis(t)
		var agents []*Agent
		for i := range 2 {
			agents = append(agents, StartAgent(t, AgentOptions{ID: fmt.Sprintf("s21l%d", i), Rules: s21Rules,
				Redis: redis.Addr, Coordinators: joinAddrs(coords.GRPC)}))
		}
		l := startRLQSLoad(t, agents, q)
		time.Sleep(3*time.Second + time.Duration(r.Int64N(int64(500*time.Millisecond))))
		_, kill, elected := coords.KillLeader(t, 2*time.Second)
		time.Sleep(3 * time.Second)
		end := mono()
		recs := l.Stop()
		if err := l.Err(); err != nil {
			t.Fatalf("an RLQS stream failed: %v", err)
		}
		j := judgeRLQS(t, recs, agents, q)
		after := admittedBy(recs, "", elected+s21Period, end)
		ok := after > 0 && j.Client.Utilisation >= s21Util
		if after == 0 {
			t.Errorf("no admission from D after the election to the end: assignments not funded again")
		}
		if j.Client.Utilisation < s21Util {
			t.Errorf("utilisation %.3f, want >= %.1f", j.Client.Utilisation, s21Util)
		}
		rlqsRow(t, "S21 leader", "Envoy RLQS (2 agents x 3 streams), Raft leader SIGKILLed", fmt.Sprintf("0 as the clients admitted it; each agent's Envoys within what it lent; utilisation >= %.1f; funded again after the election", s21Util),
			j, ok, fmt.Sprintf("election %v; admitted from D after the election: %.0f", (elected-kill).Round(time.Millisecond), after))
	})
	t.Run("cut", func(t *testing.T) {
		// One coordinator node, as S3: no redirect can route the cut
		// agent around its proxy.
		coords := startCoordinators(t, 1, s21Rules)
		redis := harness.StartRedis(t)
		px := harness.NewProxy(t, coords.GRPCAddrs()[0])
		cut := StartAgent(t, AgentOptions{ID: "s21cut", Rules: s21Rules, Redis: redis.Addr, Coordinators: px.Addr()})
		other := StartAgent(t, AgentOptions{ID: "s21other", Rules: s21Rules, Redis: redis.Addr, Coordinators: coords.GRPCAddrs()[0]})
		agents := []*Agent{cut, other}
		l := startRLQSLoad(t, agents, q)
		time.Sleep(3*time.Second + time.Duration(r.Int64N(int64(500*time.Millisecond))))
		cutAt := mono()
		px.Blackhole()
		time.Sleep(3 * s21Period)
		px.Heal()
		healed := mono()
		time.Sleep(4 * time.Second)
		end := mono()
		recs := l.Stop()
		if err := l.Err(); err != nil {
			t.Fatalf("an RLQS stream failed: %v", err)
		}
		j := judgeRLQS(t, recs, agents, q)
		stale := admittedBy(recs, cut.ID, cutAt+s21Period, healed)
		again := admittedBy(recs, cut.ID, healed, end)
		others := admittedBy(recs, other.ID, cutAt+s21Period, healed)
		ok := stale == 0 && again > 0 && j.Client.Utilisation >= s21Util
		if j.Client.Utilisation < s21Util {
			t.Errorf("utilisation %.3f, want >= %.1f", j.Client.Utilisation, s21Util)
		}
		if stale > 0 {
			t.Errorf("the cut agent's Envoys admitted %.0f between D after the cut and the heal, want 0", stale)
		}
		if again == 0 {
			t.Errorf("the cut agent's Envoys admitted nothing after the heal: not funded again")
		}
		rlqsRow(t, "S21 cut", "Envoy RLQS (2 agents x 3 streams), one agent cut from its coordinator for 3D", fmt.Sprintf("0 as the clients admitted it; each agent's Envoys within what it lent; none of the cut agent's from D after the cut; utilisation >= %.1f; funded again after the heal", s21Util),
			j, ok, fmt.Sprintf("cut agent's Envoys admitted %.0f in [cut + D, heal], %.0f after the heal; the other's %.0f in [cut + D, heal]", stale, again, others))
	})
}

// rlqsRow adds S21's row for one fault and fails t with every problem.
func rlqsRow(t *testing.T, scenario, fault, bound string, j rlqsJudged, ok bool, extra string) {
	t.Helper()
	addRow(t, Row{Scenario: scenario, Fault: fault, Bound: bound, Overshoot: j.Client.Certain.Overshoot,
		Util: j.Client.Utilisation, Pass: ok && len(j.Problems) == 0, Note: j.note() + "; " + extra})
	for _, p := range j.Problems {
		t.Errorf("%s", p)
	}
}
