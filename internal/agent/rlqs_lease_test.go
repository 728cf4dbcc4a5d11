package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
)

const heldLeaseRules = `
rules:
  - name: shared
    match: {team: "*"}
    burst: 100
    rate: 100
    mode: leased
    lease: {default_share: 1}
  - name: api
    match: {tenant: "*"}
    burst: 100
    rate: 100
    mode: auto
    auto: {promote_above: 40, demote_below: 10}
`

// heldLatency is what the client-side timestamps of direct decisions may
// lag their charges by, in tokens (r x 20ms): the strict bound's slack.
const heldLatency = 2.0

// An RLQS take decided on a lease (a default-share subject's copy of the
// default lease, a promoted auto subject's promotion lease) is lent from
// it for as long as Envoy may spend it: the lease refills only to its cap
// less the tokens Envoy has yet to spend. The scenario is the one a plain
// spend breaks: in each cycle Envoy and the direct callers go quiet while
// Envoy holds a fresh assignment (the lease refills), then Envoy spends
// all it can while the direct callers drain the lease. What they admit
// together stays within B + r*T over every window, not merely
// B + r*(T + TTL + delta).
func TestRLQSTakesLentFromLeases(t *testing.T) {
	c := harness.StartCoordinators(t, 1, heldLeaseRules)
	log := filepath.Join(t.TempDir(), "admissions.log")
	a := startAgent(t, heldLeaseRules, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
		cfg.Record = log
	})
	rec := admission.NewRecorder()
	subjects := []struct {
		quota string
		id    map[string]string
	}{
		{"shared|team=t", map[string]string{"team": "t"}},
		{"api|tenant=hot", map[string]string{"tenant": "hot"}},
	}
	// Promote the auto subject first: ~80 direct decisions a second.
	hot := subjects[1]
	promoted := time.Now().Add(10 * time.Second)
	for n := 0; n < 800 && time.Now().Before(promoted); n++ {
		if metricValue(t, a.srv.Registry, "ration_agent_hot_promotions_total", nil) >= 1 {
			break
		}
		if decideDirect(t, a, hot.id) {
			rec.Admit("direct", hot.quota, 1)
		}
		time.Sleep(12 * time.Millisecond)
	}
	if metricValue(t, a.srv.Registry, "ration_agent_hot_promotions_total", nil) < 1 {
		t.Fatal("the auto subject was not promoted")
	}
	var wg sync.WaitGroup
	clients := make([]*harness.RLQSClient, len(subjects))
	for i, s := range subjects {
		clients[i] = harness.DialRLQS(t, a.srv.GRPCAddr(), "edge", 100*time.Millisecond, func() { rec.Admit("envoy", s.quota, 1) })
		wg.Add(1)
		go func() {
			defer wg.Done()
			quietThenDrain(t, a, clients[i], rec, s.quota, s.id)
		}()
	}
	wg.Wait()
	for _, cl := range clients {
		if err := cl.Err(); err != nil {
			t.Fatal(err)
		}
	}
	lent := lentTakes(t, log)
	for _, s := range subjects {
		judgeHeld(t, rec.Records(), s.quota, 100, 100)
		if lent[s.quota] == 0 {
			t.Fatalf("%s: no take was decided on its lease (admission log)", s.quota)
		}
	}
	t.Logf("takes decided on the leases: %v", lent)
}

// quietThenDrain has Envoy ask steadily (~100/s, far above what its
// assignments fund) while the direct callers run cycles of a quiet phase
// (2s at 20/s: long enough for the lease to refill to its cap, behind
// Envoy's assignment if nothing holds it) and a drain (500/s for 0.8s),
// bounded in count and time.
func quietThenDrain(t *testing.T, a *testAgent, cl *harness.RLQSClient, rec *admission.Recorder, quota string, id map[string]string) {
	t.Helper()
	end := time.Now().Add(9 * time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := 0; n < 1000 && time.Now().Before(end); n++ {
			cl.Request(id)
			time.Sleep(10 * time.Millisecond)
		}
	}()
	defer func() { <-done }()
	for cycle := 0; cycle < 4 && time.Now().Before(end); cycle++ {
		quiet := time.Now().Add(2 * time.Second)
		for n := 0; n < 60 && time.Now().Before(quiet); n++ {
			if decideDirect(t, a, id) {
				rec.Admit("direct", quota, 1)
			}
			time.Sleep(50 * time.Millisecond)
		}
		drain := time.Now().Add(800 * time.Millisecond)
		for n := 0; n < 1000 && time.Now().Before(drain); n++ {
			if decideDirect(t, a, id) {
				rec.Admit("direct", quota, 1)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
}

func decideDirect(t *testing.T, a *testAgent, id map[string]string) bool {
	t.Helper()
	resp, err := a.srv.Service.Decide(context.Background(), agent.Request{Descriptors: id})
	if err != nil {
		t.Error(err)
	}
	return resp.Allowed
}

// lentTakes counts, per quota, the admitted takes (cost > 1) decided on a
// lease in the agent's admission log.
func lentTakes(t *testing.T, log string) map[string]int {
	t.Helper()
	f, err := os.Open(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	logged, err := admission.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, r := range logged {
		if r.Path == "leased" && r.Allowed && r.Cost > 1 {
			n[r.Quota]++
		}
	}
	return n
}

// judgeHeld holds quota's admissions to B + r*T over every window (within
// heldLatency), and asks that Envoy and the direct callers both admitted.
func judgeHeld(t *testing.T, recs []admission.Record, quota string, burst, rate float64) {
	t.Helper()
	var envoy, direct float64
	for _, r := range recs {
		switch {
		case r.Quota != quota:
		case r.Agent == "envoy":
			envoy += r.Cost
		default:
			direct += r.Cost
		}
	}
	rep := admission.Check(recs, quota, burst, rate)
	t.Logf("%s: admitted %v by Envoy, %v directly; overshoot %.2f of B + r*T (window %v..%v); utilisation %.2f",
		quota, envoy, direct, rep.Overshoot, rep.From, rep.To, rep.Utilisation)
	if rep.Overshoot > heldLatency {
		t.Errorf("%s: admissions overshoot B + r*T by %.2f in window %v..%v", quota, rep.Overshoot, rep.From, rep.To)
	}
	if envoy < 1 || direct < 1 {
		t.Errorf("%s: admitted %v by Envoy and %v directly: both must have been funded", quota, envoy, direct)
	}
}
