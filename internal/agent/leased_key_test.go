package agent_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/rules"
)

// countingLeases admits every spend while granted, and counts the spends
// of each subject; without a grant every spend finds no lease.
type countingLeases struct {
	granted bool
	mu      sync.Mutex
	spent   map[string]int
	clock   time.Time
}

func (l *countingLeases) Now() int64 { return time.Since(l.clock).Microseconds() }

func (l *countingLeases) Spend(_ context.Context, _ *rules.Rule, subject string, _ float64, now int64) (bucket.Result, holder.Source, bool) {
	if !l.granted {
		return bucket.Result{}, holder.Source{}, false
	}
	l.mu.Lock()
	l.spent[subject]++
	l.mu.Unlock()
	return bucket.Result{Allowed: true, Remaining: 1, Now: now}, holder.Source{}, true
}

func (*countingLeases) Refund(holder.Source, float64) {}
func (*countingLeases) DownFor() time.Duration        { return 0 }

const leasedKeyRules = `
rules:
  - name: leased
    match: {tenant: "*"}
    burst: 1000
    rate: 1000
    mode: leased
    on_failure: emergency
    emergency: {burst: 1, rate: 0, max_duration: 1m}
`

func leasedKeyService(t *testing.T, l *countingLeases) (*agent.Service, *prometheus.Registry) {
	t.Helper()
	set, err := rules.Parse("rules.yaml", []byte(leasedKeyRules))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	l.spent, l.clock = map[string]int{}, time.Now()
	svc, err := agent.New(agent.Options{
		Rules: agent.StaticRules{Set: set}, Store: bucket.NewMemoryStore(nil), Leases: l,
		Registry: reg, DecisionTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return svc, reg
}

// A leased rule's step leaves its bucket key unmade on the lease; the
// paths that need it still get each subject's own: the emergency bucket
// of one subject is not another's.
func TestLeasedEmergencyBucketPerSubject(t *testing.T) {
	svc, _ := leasedKeyService(t, &countingLeases{})
	ctx := context.Background()
	for _, req := range []agent.Request{
		{Rule: "leased", Subject: "a"},
		{Descriptors: map[string]string{"tenant": "b"}},
	} {
		resp, err := svc.Decide(ctx, req)
		if err != nil || !resp.Allowed || resp.Reason != agent.ReasonEmergency {
			t.Fatalf("%+v: first decision without a lease = %+v, %v; want admitted by its own emergency bucket", req, resp, err)
		}
	}
	if resp, _ := svc.Decide(ctx, agent.Request{Rule: "leased", Subject: "a"}); resp.Allowed {
		t.Fatalf("a's second decision = %+v; want denied, its emergency bucket (burst 1) spent", resp)
	}
}

// ... and the record of request ids tells apart two subjects' requests
// with the same id: neither is a replay of the other.
func TestLeasedRequestIDPerSubject(t *testing.T) {
	l := &countingLeases{granted: true}
	svc, reg := leasedKeyService(t, l)
	ctx := context.Background()
	for _, s := range []string{"a", "b", "a"} {
		if resp, err := svc.Decide(ctx, agent.Request{Rule: "leased", Subject: s, RequestID: "r1"}); err != nil || !resp.Allowed {
			t.Fatalf("%s: %+v, %v", s, resp, err)
		}
	}
	if l.spent["a"] != 1 || l.spent["b"] != 1 {
		t.Fatalf("spends = %v; want a and b once each (the second a a replay)", l.spent)
	}
	if got := metricValue(t, reg, "ration_request_id_replays_total", map[string]string{"rule": "leased"}); got != 1 {
		t.Fatalf("replays = %v, want 1", got)
	}
	if got := metricValue(t, reg, "ration_decisions_total",
		map[string]string{"rule": "leased", "path": "leased", "result": "allowed", "reason": "ok"}); got != 2 {
		t.Fatalf("leased decisions counted = %v, want 2", got)
	}
}
