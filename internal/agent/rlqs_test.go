package agent_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
)

const rlqsRules = `
rules:
  - name: hot
    match: {hot: "*"}
    burst: 400
    rate: 100
    mode: leased
    lease: {period: 4s}
`

// Envoys on RLQS against agents on leases of one quota, a real 3-node
// coordinator group, real sockets: 2 agents, 2 clients each, all asking
// for far more than the rule's rate for a few seconds. Every admission a
// client's own token buckets made is recorded and the whole is judged
// against B + r*T over every window: no overshoot, whatever the clients
// do with restarts of full buckets. Utilisation is about 0.7 here (the
// burst reaches Envoys only through max_tokens: docs/integrations/
// envoy-rlqs.md, Limits); the floor below only says that assignments were
// funded at all (TestRLQSGreedyEnvoysReachTheBudget judges utilisation).
func TestRLQSClientsWithinBound(t *testing.T) {
	c := harness.StartCoordinators(t, 3, rlqsRules)
	rec := admission.NewRecorder()
	const run = 5 * time.Second
	var clients []*harness.RLQSClient
	for i := range 2 {
		a := startAgent(t, rlqsRules, func(cfg *agent.Config) {
			cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
		})
		for j := range 2 {
			name := fmt.Sprintf("envoy-%d-%d", i, j)
			cl := harness.DialRLQS(t, a.srv.GRPCAddr(), "edge", 500*time.Millisecond, func() { rec.Admit(name, "hot|hot=a", 1) })
			clients = append(clients, cl)
		}
	}
	driveRLQS(t, clients, map[string]string{"hot": "a"}, run)
	rep := admission.Check(rec.Records(), "hot|hot=a", 400, 100)
	t.Logf("admitted %v in %d requests; overshoot %.2f, utilisation %.2f", rep.Admitted, rep.Count, rep.Overshoot, rep.Utilisation)
	if rep.Overshoot > 1e-9 {
		t.Fatalf("RLQS admissions overshoot B + r*T by %.2f tokens (window %v..%v)", rep.Overshoot, rep.From, rep.To)
	}
	if rep.Admitted < 50 {
		t.Fatalf("admitted %v in %v: the assignments funded almost nothing", rep.Admitted, run)
	}
}

// With its coordinators gone, a leased local_emergency rule's RLQS
// buckets are funded by takes from the agent's emergency bucket for the
// rule and subject, as its RLS requests would be: three Envoys asking far
// more than the emergency rate admit, together, within emergency.burst +
// emergency.rate*T over every window, not that much each.
func TestRLQSLeasedEmergencyPerAgent(t *testing.T) {
	const rulesYAML = `
rules:
  - name: hot
    match: {hot: "*"}
    burst: 400
    rate: 100
    mode: leased
    lease: {period: 2s}
    on_failure: emergency
    emergency: {burst: 10, rate: 5, max_duration: 1m}
`
	c := harness.StartCoordinators(t, 1, rulesYAML)
	a := startAgent(t, rulesYAML, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
	})
	c.Kill(0)
	rec := admission.NewRecorder()
	var clients []*harness.RLQSClient
	for i := range 3 {
		name := fmt.Sprintf("envoy-%d", i)
		clients = append(clients, harness.DialRLQS(t, a.srv.GRPCAddr(), "edge", 200*time.Millisecond, func() { rec.Admit(name, "hot|hot=a", 1) }))
	}
	// The agent sees its coordinator gone at its next failed request
	// (about 2s in); until then a quota not granted yet is denied.
	driveRLQS(t, clients, map[string]string{"hot": "a"}, 6*time.Second)
	rep := admission.Check(rec.Records(), "hot|hot=a", 10, 5)
	emergency := metricSum(t, a.srv.Registry, "ration_decisions_total", map[string]string{"rule": "hot", "path": "fallback", "result": "allowed", "reason": "emergency"})
	t.Logf("%v takes charged to the emergency bucket; the Envoys admitted %v, overshoot %.2f of 10 + 5*T (window %v..%v)", emergency, rep.Admitted, rep.Overshoot, rep.From, rep.To)
	if rep.Overshoot > 1e-9 {
		t.Fatalf("the Envoys admitted over the agent's emergency bucket by %.2f (window %v..%v)", rep.Overshoot, rep.From, rep.To)
	}
	if emergency < 1 || rep.Admitted < 1 {
		t.Fatalf("%v emergency takes, %v admitted: the emergency bucket funded nothing", emergency, rep.Admitted)
	}
}

// A bucket of a leased quota this agent has not been granted yet is not
// held up waiting for the first grant: its loan would be recorded as
// sent before the wait, ending that much early in the books and past the
// lease's validity at Envoy. It is denied briefly (not its failure
// policy: the coordinators answer), and funded at a later report.
func TestRLQSNewQuotaNotWaitedFor(t *testing.T) {
	c := harness.StartCoordinators(t, 1, rlqsRules)
	a := startAgent(t, rlqsRules, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
	})
	s := openRLQS(t, a)
	report := &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"hot": "new"}}, NumRequestsAllowed: 1, TimeElapsed: durationpb.New(time.Second)}}}
	var kinds []string
	for n := 0; n < 50; n++ {
		if err := s.Send(report); err != nil {
			t.Fatal(err)
		}
		resp, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		a := resp.GetBucketAction()[0].GetQuotaAssignmentAction()
		kind := "allow_all"
		switch {
		case a.GetRateLimitStrategy().GetTokenBucket() != nil:
			kind = "token_bucket"
		case a.GetRateLimitStrategy().GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL:
			kind = "deny_all"
		}
		kinds = append(kinds, kind)
		if kind == "token_bucket" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if kinds[0] != "deny_all" {
		t.Fatalf("first action for a quota not granted yet: %s, want deny_all (asked again, not waited for)", kinds[0])
	}
	if kinds[len(kinds)-1] != "token_bucket" {
		t.Fatalf("actions %v: never funded once the quota was granted", kinds)
	}
}

// driveRLQS has every client ask for bucket id once a millisecond for run
// (at most 20,000 times each), then fails the test on a broken stream.
func driveRLQS(t *testing.T, clients []*harness.RLQSClient, id map[string]string, run time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	end := time.Now().Add(run)
	for _, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 20000 && time.Now().Before(end); n++ {
				cl.Request(id)
				time.Sleep(time.Millisecond)
			}
		}()
	}
	wg.Wait()
	for _, cl := range clients {
		if err := cl.Err(); err != nil {
			t.Fatalf("client stream: %v", err)
		}
	}
}

// A graceful shutdown ends the agent's RLQS streams (Envoy opens them
// again elsewhere) instead of waiting for them to its time limit, past
// which the agent stops without releasing its leases and closing its
// store.
func TestShutdownEndsRLQSStreams(t *testing.T) {
	a := startAgent(t, `
rules:
  - name: api
    match: {tenant: "*"}
    burst: 100
    rate: 100
`)
	cl := harness.DialRLQS(t, a.srv.GRPCAddr(), "edge", 100*time.Millisecond, nil)
	id := map[string]string{"tenant": "a"}
	waitFor(t, "an RLQS assignment", func() bool { cl.Request(id); return cl.Kind(id) != "" })
	// A bound far above a graceful stop's (milliseconds), so that only
	// a stop that waits for the stream reaches it.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := a.srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with an RLQS stream open: %v, want a graceful stop", err)
	}
	waitFor(t, "the stream's end at the client", func() bool { return cl.Err() != nil })
	if err := cl.Err(); status.Code(err) != codes.Unavailable {
		t.Fatalf("the client's stream ended with %v, want Unavailable (the agent is shutting down)", err)
	}
}

// openRLQS opens a raw RLQS stream to a, for a test to speak the protocol
// itself; it ends with the test, or after 30s.
func openRLQS(t *testing.T, a *testAgent) rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient {
	t.Helper()
	conn, err := grpc.NewClient(a.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	s, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
