package coordinator_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// TestIncarnationsPerIdentityAreBounded runs a coordinator with mutual TLS.
// Mallory's one agent certificate mints 30 incarnations at once, each
// asking for a share of the quota Alice holds: only MaxIncarnations get
// leases, the others are refused RESOURCE_EXHAUSTED naming the limit, and
// counted. Alice's fair share stays what two more holders leave her, not
// what 30 would. A restart of Alice (a new incarnation while the old one
// still holds, as after a crash) gets its leases, and so does a new one of
// Mallory's once an old one released.
func TestIncarnationsPerIdentityAreBounded(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 1, testRules, pki, noTicks)
	i, ln := c.Leader(t)
	alice := tlsClient(c, pki, pki.Agent("alice"))
	mallory := tlsClient(c, pki, pki.Agent("mallory"))
	ops := adminWith(t, ln.AdminAddr(), pki.DialOptions(pki.Operator("ops")))
	ctx := timeout(t, 60*time.Second)
	quota := []*rationv1.QuotaRef{{Rule: "per-tenant", Subject: "acme"}}

	renew := func(client *coordinator.Client, h *holder) error {
		t.Helper()
		req := h.request(quota, 100)
		resp, err := client.Renew(ctx, req)
		if err != nil {
			return err
		}
		return h.adopt(req, resp)
	}
	a := newHolder("alice/1")
	if err := renew(alice, a); err != nil {
		t.Fatalf("alice: %v", err)
	}

	const minted = 30
	ms := make([]*holder, minted)
	errs := make([]error, minted)
	var wg sync.WaitGroup
	for k := range ms {
		ms[k] = newHolder(fmt.Sprintf("mallory/%d", k))
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = renew(mallory, ms[k])
		}()
	}
	wg.Wait()
	var held []*holder
	for k, err := range errs {
		switch {
		case err == nil:
			held = append(held, ms[k])
		case status.Code(err) != codes.ResourceExhausted:
			t.Errorf("mallory/%d: %v, want RESOURCE_EXHAUSTED", k, err)
		case !strings.Contains(err.Error(), fmt.Sprintf("at most %d per certificate identity", coordinator.MaxIncarnations)):
			t.Errorf("mallory/%d: error %q does not name the limit", k, err)
		}
	}
	if len(held) != coordinator.MaxIncarnations {
		t.Fatalf("%d of mallory's %d incarnations got leases, want %d", len(held), minted, coordinator.MaxIncarnations)
	}
	if got := harness.Counter(t, c.Registry(i), "ration_coordinator_incarnations_refused_total"); got != minted-coordinator.MaxIncarnations {
		t.Errorf("ration_coordinator_incarnations_refused_total = %v, want %d", got, minted-coordinator.MaxIncarnations)
	}

	// Every holder renews at the same demand until the shares settle:
	// Alice's is a third of the rate (alice, two of mallory's), not a 31st.
	for range 5 {
		for _, h := range append([]*holder{a}, held...) {
			client := mallory
			if h == a {
				client = alice
			}
			if err := renew(client, h); err != nil {
				t.Fatalf("%s renews: %v", h.name, err)
			}
		}
	}
	if got, floor := a.leases[qid(quota[0])].GetRate(), 5.0/float64(coordinator.MaxIncarnations+1)*0.9; got < floor {
		t.Errorf("alice's rate is %v, want at least %v (a third of 5/s)", got, floor)
	}

	// Alice restarts after a crash: her old incarnation still holds.
	a2 := newHolder("alice/2")
	if err := renew(alice, a2); err != nil {
		t.Fatalf("alice's new incarnation, the old one still holding: %v", err)
	}
	// One of Mallory's stops gracefully, releasing its lease: a new
	// incarnation takes its place.
	old := held[0]
	g := old.leases[qid(quota[0])]
	if _, err := mallory.Release(ctx, &rationv1.ReleaseRequest{Holder: old.name, Seq: old.seq,
		Items: []*rationv1.RenewItem{{LeaseId: g.LeaseId}}}); err != nil {
		t.Fatalf("release %s: %v", old.name, err)
	}
	if err := renew(mallory, newHolder("mallory/restarted")); err != nil {
		t.Fatalf("mallory's new incarnation after one released: %v", err)
	}
	var mal int
	for _, l := range leasesOfAll(t, ops) {
		if strings.HasPrefix(l.Holder, "mallory/") {
			mal++
		}
	}
	if mal != coordinator.MaxIncarnations {
		t.Errorf("mallory's incarnations hold %d leases, want %d", mal, coordinator.MaxIncarnations)
	}
}

// leasesOfAll lists every lease the leader knows.
func leasesOfAll(t *testing.T, admin rationv1.AdminClient) []*rationv1.LeaseStatus {
	t.Helper()
	resp, err := admin.ListLeases(timeout(t, 10*time.Second), &rationv1.ListLeasesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Leases
}
