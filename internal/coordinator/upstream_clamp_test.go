package coordinator_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// A regional group whose -upstream answers with more than the rule allows
// (a group that is not the fleet's global group, or one running other
// rules) funds no quota past the rule as the region's rules give it: a
// rogue "global" group granted a region funded_rate 999985 on a rule of
// rate 20. The clamp is counted.
func TestUpstreamGrantHeldToTheRule(t *testing.T) {
	const rogue = `
rules:
  - name: g
    match: {k: "*"}
    burst: 1000000
    rate: 1000000
    mode: leased
    scope: global
    lease: {period: 1s}
    regions: {eu: {weight: 1}}
`
	honest := strings.NewReplacer("burst: 1000000", "burst: 50", "rate: 1000000", "rate: 20").Replace(rogue)
	set, err := rules.Parse("rules.yaml", []byte(honest))
	if err != nil {
		t.Fatal(err)
	}
	h := harness.StartHierarchy(t, 1, rogue, nil)
	eu := h.AddRegion("eu", 1, func(c *coordinator.Config) { c.Rules = set })
	li, _ := eu.Leader(t)
	ctx := timeout(t, 60*time.Second)
	cl := eu.Client(coordinator.ClientOptions{CallTimeout: 2 * time.Second, MaxAttempts: 3})
	// An agent of the region asks for the quota, with a demand past any
	// rule: the regional leader leases it upstream and funds it.
	if _, err := cl.Renew(ctx, &rationv1.RenewRequest{Holder: "a1/1", Seq: 1,
		Items: []*rationv1.RenewItem{{Quota: &rationv1.QuotaRef{Rule: "g", Subject: "k=x"}, Demand: 1e6}}}); err != nil {
		t.Fatalf("renew: %v", err)
	}
	reg := eu.Registry(li)
	if waitFor(30*time.Second, func() bool {
		return counterValue(t, reg, "ration_coordinator_upstream_grants_clamped_total") >= 1
	}) == 0 {
		t.Fatal("no upstream grant was clamped: the regional leader never funded the quota, or funded it past the rule")
	}
	quotas, err := eu.LeaderAdmin(t).ListQuotas(ctx, &rationv1.ListQuotasRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range quotas.GetQuotas() {
		if q.GetQuota() == "g|k=x" && (q.GetRate() > 20*(1+1e-9) || q.GetBurst() > 50*(1+1e-9)) {
			t.Errorf("region eu funds g|k=x at burst %v, rate %v: past the rule's 50, 20/s", q.GetBurst(), q.GetRate())
		}
	}
}

// counterValue is the value of an unlabelled counter of reg (-1: none).
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return -1
}
