package agent_test

import (
	"testing"

	"github.com/ration-dev/ration/internal/admission"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

const refundRules = `
rules:
  - name: wide
    match: {tenant: "*"}
    burst: 1
    rate: 0.01
  - name: narrow
    match: {endpoint: search}
    burst: 1
    rate: 0.01
`

// A request that wide admits (taking its last token, which the agent
// remembers: in a flood the next ones would all be denied) and narrow
// denies is refunded to wide. The refund must also clear what the agent
// remembers of wide's bucket: otherwise the tenant's next request is
// denied by the agent itself for up to 100s (wide's refill of one token)
// while Redis holds the token: a refusal the second judge calls false.
func TestRefundClearsTheRememberedDenial(t *testing.T) {
	a := startAgent(t, refundRules)
	const quota = "wide|tenant=acme"
	rec := admission.NewRecorder()
	if r := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"endpoint": "search"}}); !r.Allowed {
		t.Fatalf("narrow's first request = %v, want admitted", r)
	}
	r := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"tenant": "acme", "endpoint": "search"}})
	if r.Allowed || r.Rule != "narrow" {
		t.Fatalf("tenant acme on search = %v, want denied by narrow (spent), wide refunded", r)
	}
	r = a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"tenant": "acme"}})
	if r.Allowed {
		rec.Admit("agent", quota, 1)
	} else {
		rec.Deny("agent", quota, 1)
	}
	rep := admission.Check(rec.Records(), quota, 1, 0.01)
	if rep.Refusals.False != 0 {
		t.Fatalf("tenant acme's request after the refund = %v: %d false refusals (wide's bucket held its token)", r, rep.Refusals.False)
	}
}
