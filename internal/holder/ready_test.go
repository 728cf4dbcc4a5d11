package holder_test

import (
	"context"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
)

// A default lease counts as fetched (an agent's readiness) only once it
// can pay a token: an agent that starts while another holds the whole
// default lease is granted an empty one at first, and ready on it, its
// first subjects' copies paid nothing (each took a lease of its own).
// Fetched waits for the leader to move the other agent's excess to it,
// so the first decision of a fresh subject there is paid by its copy.
func TestPrefetchedDefaultLeaseHoldsATokenWhenFetched(t *testing.T) {
	const yaml = `
rules:
  - name: r
    match: {tenant: "*"}
    burst: 100
    rate: 100/m
    mode: leased
    lease: {period: 10s, default_share: 0.5}
`
	c := harness.StartCoordinators(t, 1, yaml)
	r := rule(t, yaml, "r")
	fetch := func(h *holder.Leases) {
		t.Helper()
		h.Prefetch(r)
		deadline := time.Now().Add(10 * time.Second)
		for h.Fetched(r) != "" {
			if time.Now().After(deadline) {
				t.Fatalf("default lease not fetched within 10s: %s", h.Fetched(r))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// A long cold start, so that the bound on the wait for a share is not
	// what ends it, however slow the machine.
	first, _ := runHolder(t, c, holder.Options{Holder: "first", ColdStart: 10 * time.Second})
	fetch(first)
	if capacity, _, _ := first.Share(r.Name, "*"); capacity < 49 {
		t.Fatalf("the first agent's default lease has cap %v, want the whole 50", capacity)
	}
	second, _ := runHolder(t, c, holder.Options{Holder: "second", ColdStart: 10 * time.Second})
	fetch(second)
	res, src, ok := second.Spend(context.Background(), r, "tenant=fresh", 1, second.Now())
	capacity, rate, _ := second.Share(r.Name, "*")
	if !ok || !res.Allowed || !src.Shared() {
		t.Fatalf("first decision of a fresh subject on the second agent once its default lease was fetched (cap %v, rate %v): ok %v, allowed %v, paid by its copy %v; want admitted from the copy",
			capacity, rate, ok, res.Allowed, src.Shared())
	}
}
