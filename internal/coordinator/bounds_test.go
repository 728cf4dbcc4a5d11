package coordinator_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// boundsRules: per-tenant quotas that refill in 0.1s, and a rule that
// allows two subjects at once.
const boundsRules = `
rules:
  - name: tenant
    match: {tenant: "*"}
    burst: 10
    rate: 100
    mode: leased
    lease: {period: 2s, max_subjects: 1000}
  - name: capped
    match: {user: "*"}
    burst: 10
    rate: 100
    mode: leased
    lease: {period: 2s, max_subjects: 2}
`

// TestIdleQuotasLeaveEveryReplica: quotas whose subjects have gone idle
// (leases given back, pools refilled) are removed from the replicated
// state of every node by the leader's Tick, and come back at the next
// grant, even for quotas the leader had already configured in its term
// (its cache of configured shapes must not make the grant fail). A rule's
// max_subjects refuses one subject more with "too many subjects".
func TestIdleQuotasLeaveEveryReplica(t *testing.T) {
	c := harness.StartCoordinators(t, 3, boundsRules)
	cl := c.Client(coordinator.ClientOptions{CallTimeout: 2 * time.Second, MaxAttempts: 50, BackoffMax: 200 * time.Millisecond})
	ctx := timeout(t, 60*time.Second)
	const n = 20
	seq := uint64(1)
	renew := func(items []*rationv1.RenewItem) *rationv1.RenewResponse {
		t.Helper()
		resp, err := cl.Renew(ctx, &rationv1.RenewRequest{Holder: "agent", Seq: seq, Items: items})
		if err != nil {
			t.Fatalf("renew seq %d: %v", seq, err)
		}
		seq += uint64(len(items))
		return resp
	}
	grantAll := func() []*rationv1.Grant {
		t.Helper()
		var items []*rationv1.RenewItem
		for i := range n {
			items = append(items, &rationv1.RenewItem{Quota: &rationv1.QuotaRef{Rule: "tenant", Subject: fmt.Sprint("t", i)}, Demand: 1000})
		}
		grants := renew(items).Grants
		for i, g := range grants {
			if g.Error != "" || g.LeaseId == 0 || g.Balance != 10 {
				t.Fatalf("grant %d: %v, want a lease with the whole (full) quota", i, g)
			}
		}
		return grants
	}
	quotas := func(i int) int {
		st, _ := c.Node(i).FSM().State()
		return st.NumQuotas()
	}

	grants := grantAll()
	// A renewal: the leader now holds these shapes as configured.
	var items []*rationv1.RenewItem
	for i, g := range grants {
		items = append(items, &rationv1.RenewItem{Quota: &rationv1.QuotaRef{Rule: "tenant", Subject: fmt.Sprint("t", i)},
			LeaseId: g.LeaseId, Demand: 1000, ConfirmedCap: g.Cap, ConfirmedRate: g.Rate})
	}
	for i, g := range renew(items).Grants {
		if g.Error != "" {
			t.Fatalf("renewal %d: %s", i, g.Error)
		}
		items[i].Unused = g.Cap // all of it, given back below
	}
	if _, err := cl.Release(ctx, &rationv1.ReleaseRequest{Holder: "agent", Seq: seq, Items: items}); err != nil {
		t.Fatal(err)
	}
	seq += uint64(len(items))
	for i := range c.N() {
		if got := quotas(i); got != n {
			t.Logf("node%d holds %d quotas right after the release", i, got)
		}
	}
	// Idle: removed by the next Tick, on every node.
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := 0
		for i := range c.N() {
			left += quotas(i)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d quotas still held over the nodes 10s after every subject went idle", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
	state, _ := c.Converged(t)
	if strings.Contains(string(state), "tenant|") {
		t.Fatalf("converged state still names a tenant quota: %s", state)
	}
	// Back at the next grant, full, although the leader had configured
	// them this term.
	grantAll()
	for i := range c.N() {
		if err := checkConservation(c.Node(i)); err != nil {
			t.Error(err)
		}
	}

	// max_subjects: 2.
	var capped []*rationv1.RenewItem
	for i := range 3 {
		capped = append(capped, &rationv1.RenewItem{Quota: &rationv1.QuotaRef{Rule: "capped", Subject: fmt.Sprint("u", i)}, Demand: 1})
	}
	got := renew(capped).Grants
	if got[0].Error != "" || got[1].Error != "" || got[2].Error != coordinator.ItemErrTooManySubjects {
		t.Fatalf("three subjects of a rule with max_subjects 2: errors %q, %q, %q; want the third %q",
			got[0].Error, got[1].Error, got[2].Error, coordinator.ItemErrTooManySubjects)
	}
}
