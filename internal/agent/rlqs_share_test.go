package agent_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
)

const shareRules = `
rules:
  - name: hot
    match: {hot: "*"}
    burst: 100
    rate: 20
    mode: leased
    lease: {period: 4s}
`

// A client of the agent claims a huge demand (2^40 requests denied, within
// what a report may count) for buckets of a subject an honest Envoy of
// another stream uses, and repeats them every second: its claims stand
// for as long as it does. The subject's lease
// rate is shared among its buckets on the agent max-min fairly, each claim
// capped at the rule's rate, so the honest Envoy keeps an equal share at
// least, or its whole demand if that is less. Two subjects side by side:
//
//   - hot=a: the honest Envoy asks far above the rule's rate, one bucket
//     claims 2^40 (split by demand, it took everything: 0 admitted);
//   - hot=b: the honest Envoy asks 5/s, eight buckets claim 2^40 each: any
//     split in proportion to demand, even of demands capped at the rule's
//     rate, leaves it under 1/s, which lends it nothing.
func TestRLQSDemandClaimCannotStarve(t *testing.T) {
	c := harness.StartCoordinators(t, 1, shareRules)
	a := startAgent(t, shareRules, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
	})
	cases := []struct {
		subject string
		every   time.Duration // between the honest Envoy's requests
		claims  int
	}{{"a", 10 * time.Millisecond, 1}, {"b", 200 * time.Millisecond, 8}}
	type result struct{ before, after int }
	results := make([]result, len(cases))
	errs := make([]error, len(cases))
	var wg sync.WaitGroup
	for i, tc := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i].before, results[i].after, errs[i] = claimAgainst(t, a, tc.subject, tc.every, tc.claims)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i, tc := range cases {
		r := results[i]
		t.Logf("hot=%s, honest Envoy every %v: %d admitted in 8s alone, %d in 8s from 10s after %d claims of 2^40 by another stream", tc.subject, tc.every, r.before, r.after, tc.claims)
		if r.before < 20 {
			t.Fatalf("hot=%s: setup: the honest Envoy admitted only %d in 8s alone", tc.subject, r.before)
		}
		if 3*r.after < r.before {
			t.Errorf("hot=%s: %d buckets' demand claims starve the subject's honest Envoy: %d admitted in 8s, %d alone", tc.subject, tc.claims, r.after, r.before)
		}
	}
}

// claimAgainst measures what an honest Envoy of subject hot=<subject>,
// asking once every every, admits in 8s alone, then in 8s from 10s after
// one report of another stream claimed 2^40 requests denied for each of
// claims other buckets of the subject (long enough for the claimant's
// assignments to be over and the honest Envoy's to be renewed).
func claimAgainst(t *testing.T, a *testAgent, subject string, every time.Duration, claims int) (before, after int, err error) {
	honest := harness.DialRLQS(t, a.srv.GRPCAddr(), "edge", 500*time.Millisecond, nil)
	id := map[string]string{"hot": subject}
	admitFor(honest, id, every, 4*time.Second) // the quota's first grant
	before = admitFor(honest, id, every, 8*time.Second)
	conn, err := grpc.NewClient(a.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, 0, fmt.Errorf("hot=%s: dial: %w", subject, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("hot=%s: claimant's stream: %w", subject, err)
	}
	rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge"}
	for i := range claims {
		rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:          &rlqsv3.BucketId{Bucket: map[string]string{"hot": subject, "x": fmt.Sprint("claim-", i)}},
			NumRequestsDenied: 1 << 40,
		})
	}
	if err := s.Send(rep); err != nil {
		return 0, 0, fmt.Errorf("hot=%s: claim: %w", subject, err)
	}
	// The claimant reads what it is sent (its stream stays healthy) and
	// repeats its claims every second, so that they stand (a claim its
	// client stops reporting lapses within seconds).
	go func() {
		for {
			if _, err := s.Recv(); err != nil {
				return
			}
		}
	}()
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for range 30 {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if s.Send(rep) != nil {
					return
				}
			}
		}
	}()
	admitFor(honest, id, every, 10*time.Second)
	after = admitFor(honest, id, every, 8*time.Second)
	if err := honest.Err(); err != nil {
		return 0, 0, fmt.Errorf("hot=%s: honest stream: %w", subject, err)
	}
	return before, after, nil
}

// admitFor has cl ask for id once every every for d (at most 2,000 times)
// and returns how many it admitted.
func admitFor(cl *harness.RLQSClient, id map[string]string, every, d time.Duration) int {
	end := time.Now().Add(d)
	n := 0
	for i := 0; i < 2000 && time.Now().Before(end); i++ {
		if cl.Request(id) {
			n++
		}
		time.Sleep(every)
	}
	return n
}
