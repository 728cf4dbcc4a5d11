package holder_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
	"github.com/ration-dev/ration/internal/lease"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// One call with a holder's name and a sequence number far ahead used to
// lock the holder out: once applied, every later request of its was
// stale, its leases lapsed, and its callers got the failure policy until
// it restarted. Against a real coordinator: a number more than
// lease.MaxSeqAhead past the coordinator's clock is refused (OUT_OF_RANGE) and
// changes nothing; one within it is applied, and the holder, refused as
// stale, numbers past it (lease.PastStale) and holds valid leases again.
func TestHolderRecoversFromASeqSentAhead(t *testing.T) {
	const yaml = `
rules:
  - name: r
    match: {user: "*"}
    burst: 100
    rate: 100
    mode: leased
    lease: {period: 1s}
`
	c := harness.StartCoordinators(t, 1, yaml)
	r := rule(t, yaml, "r")
	reg := prometheus.NewRegistry()
	h, _ := runHolder(t, c, holder.Options{Holder: "a", Registry: reg})
	ctx := context.Background()
	if res, ok := h.Take(ctx, r, "user=x", 1, h.Now()); !ok || !res.Allowed {
		t.Fatalf("first decision: admitted %v, lease valid %v", res.Allowed, ok)
	}
	mallory := c.Client(coordinator.ClientOptions{CallTimeout: 2 * time.Second, MaxAttempts: 3})
	ahead := func(d time.Duration) *rationv1.RenewRequest {
		return &rationv1.RenewRequest{Holder: h.Name(), Seq: uint64(time.Now().Add(d).UnixMicro()),
			Items: []*rationv1.RenewItem{{Quota: &rationv1.QuotaRef{Rule: "r", Subject: "user=y"}, Demand: 1}}}
	}
	_, err := mallory.Renew(ctx, ahead(lease.MaxSeqAhead+time.Hour))
	if status.Code(err) != codes.OutOfRange {
		t.Fatalf("a seq %v past the coordinator's clock: %v, want OUT_OF_RANGE", lease.MaxSeqAhead+time.Hour, err)
	}
	if _, err := mallory.Renew(ctx, ahead(lease.MaxSeqAhead/2)); err != nil {
		t.Fatalf("a seq %v ahead, within the limit: %v, want it applied", lease.MaxSeqAhead/2, err)
	}
	// The holder's next renewal is stale; it must number past the
	// applied one and renew again, well before its callers notice.
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("30s after a seq sent ahead, %s: renewals ok %v, failed %v", what,
					renewals(t, reg, "ok"), renewals(t, reg, "error"))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	failed := renewals(t, reg, "error")
	wait("no renewal refused as stale", func() bool { return renewals(t, reg, "error") > failed })
	ok := renewals(t, reg, "ok")
	wait("no renewal succeeded since: the holder is locked out", func() bool { return renewals(t, reg, "ok") > ok })
	// Renewing again: a decision finds a valid lease, past the period
	// the lease had when the locked-out renewals began.
	time.Sleep(2 * time.Second)
	if _, ok := h.Take(ctx, r, "user=x", 1, h.Now()); !ok {
		t.Fatalf("2 lease periods after recovering, no valid lease")
	}
}

// renewals reads ration_agent_lease_renewals_total{result}.
func renewals(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ration_agent_lease_renewals_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
