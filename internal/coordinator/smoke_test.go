package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

const testRules = `
rules:
  - name: hot
    match: {endpoint: hot}
    burst: 100
    rate: 10
    mode: leased
    lease: {period: 2s, min_slice: 0, max_slice: 0}
  - name: per-tenant
    match: {tenant: "*"}
    burst: 50
    rate: 5
    mode: leased
    lease: {period: 2s}
  - name: plain
    match: {endpoint: plain}
    burst: 10
    rate: 1
`

func TestSmoke(t *testing.T) {
	c := harness.StartCoordinators(t, 3, testRules)
	_, l := c.Leader(t)
	t.Logf("leader %s", l.ID())
	cl := c.Client(coordinator.ClientOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cl.Renew(ctx, &rationv1.RenewRequest{Holder: "a", Seq: 1, Items: []*rationv1.RenewItem{
		{Quota: &rationv1.QuotaRef{Rule: "hot"}, Demand: 5},
		{Quota: &rationv1.QuotaRef{Rule: "per-tenant", Subject: "acme"}, Demand: 5},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(resp)
	resp, err = cl.Renew(ctx, &rationv1.RenewRequest{Holder: "a", Seq: 3, Items: []*rationv1.RenewItem{
		{Quota: &rationv1.QuotaRef{Rule: "hot"}, LeaseId: resp.Grants[0].LeaseId, Demand: 5},
		{Quota: &rationv1.QuotaRef{Rule: "plain"}, Demand: 5},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(resp)
	c.Converged(t)
}
