package coordinator_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// TestAutoRuleQuotas: a mode auto rule is leased one promotion at a time,
// subject@epoch, and such a quota's pool starts empty (the subject's Redis
// bucket may have spent the budget up to the promotion): the first grant
// carries a cap and a rate but no tokens. A bare subject is refused, per
// item, naming the form.
func TestAutoRuleQuotas(t *testing.T) {
	const yaml = `
rules:
  - name: api
    match: {tenant: "*"}
    burst: 100
    rate: 10
    mode: auto
`
	c := harness.StartCoordinators(t, 1, yaml)
	cl := c.Client(coordinator.ClientOptions{})
	ctx := timeout(t, 30*time.Second)
	promoted := &rationv1.QuotaRef{Rule: "api", Subject: rules.PromotedSubject("tenant=a", 1796000000000000)}
	bare := &rationv1.QuotaRef{Rule: "api", Subject: "tenant=a"}
	h := newHolder("agent-a")
	req := h.request([]*rationv1.QuotaRef{promoted, bare}, 10)
	resp, err := cl.Renew(ctx, req)
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	g := resp.Grants[0]
	if g.Error != "" || g.Cap != 100 || g.Rate != 10 || g.Balance != 0 {
		t.Fatalf("grant of a promotion = %+v; want cap 100, rate 10 and no tokens (its pool starts empty)", g)
	}
	if e := resp.Grants[1].Error; !strings.Contains(e, "unknown quota") || !strings.Contains(e, "subject@epoch") {
		t.Fatalf("grant of a bare subject of an auto rule: error %q, want unknown quota naming subject@epoch", e)
	}
}
