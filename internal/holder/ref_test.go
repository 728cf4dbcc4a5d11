package holder_test

import (
	"context"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/holder"
)

const refRules = `
rules:
  - name: slow
    match: {k: "*"}
    burst: 10
    rate: 0.001
    mode: leased
    lease: {period: 1s}
  - name: shared
    match: {s: "*"}
    burst: 10
    rate: 1
    mode: leased
    lease: {period: 1s, default_share: 0.5}
`

// A Ref spends the same lease as Spend: alternating the two, one holder
// of a quota of burst 10 that hardly refills admits at most 10, and the
// Ref's answers are Spend's (remaining, retry-after). A Ref finds nothing
// before the quota exists and for a rule with a default share; once its
// quota is forgotten for idleness the Ref spends nothing (ok false) and
// a new one, taken after Spend adds the quota again, does.
func TestRefSpendsTheQuotasLease(t *testing.T) {
	c := harness.StartCoordinators(t, 1, refRules)
	r := rule(t, refRules, "slow")
	h, _ := runHolder(t, c, holder.Options{Holder: "a", IdleAfter: 300 * time.Millisecond})
	ctx := context.Background()

	if _, _, _, _, ok := h.Ref(r, "x").Spend(1); ok {
		t.Fatal("a Ref of a quota never decided spent: want ok false")
	}
	if _, _, _, _, ok := h.Ref(rule(t, refRules, "shared"), "s=x").Spend(1); ok {
		t.Fatal("a Ref of a default-share rule spent: want ok false (its subjects spend their copy first)")
	}
	res, ok := h.Take(ctx, r, "x", 1, h.Now())
	if !ok || !res.Allowed {
		t.Fatalf("first decision: ok %v, %+v; want admitted on the first grant", ok, res)
	}
	admitted := 1
	ref := h.Ref(r, "x")
	for i := range 20 {
		if i%2 == 0 {
			allowed, remaining, _, retry, ok := ref.Spend(1)
			if !ok {
				t.Fatalf("decision %d through the Ref: ok false with a valid lease", i)
			}
			if allowed {
				admitted++
			} else if remaining >= 1 || retry <= 0 {
				t.Fatalf("decision %d through the Ref denied with %v remaining, retry after %v", i, remaining, retry)
			}
			continue
		}
		res, ok := h.Take(ctx, r, "x", 1, h.Now())
		if !ok {
			t.Fatalf("decision %d through Take: no valid lease", i)
		}
		if res.Allowed {
			admitted++
		}
	}
	if admitted > 10 {
		t.Fatalf("admitted %d on a quota of burst 10 (rate 0.001/s): the Ref and Take spent apart", admitted)
	}
	if admitted < 2 {
		t.Fatalf("admitted %d: the lease was not spent at all", admitted)
	}

	// Forgotten for idleness (a Spend would be a use: only look it up),
	// and released, so the old Ref spends nothing.
	deadline := time.Now().Add(10 * time.Second)
	for h.Ref(r, "x") != (holder.Ref{}) {
		if time.Now().After(deadline) {
			t.Fatal("the quota is still found 10s after its last use (idle after 300ms)")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, _, _, _, ok := ref.Spend(1); ok {
		t.Fatal("the Ref of a forgotten quota spent: want ok false (its lease was given back)")
	}
	if _, ok := h.Take(ctx, r, "x", 1, h.Now()); !ok {
		t.Fatal("the quota decided again after it was forgotten: no lease")
	}
	fresh := h.Ref(r, "x")
	if fresh == ref || fresh == (holder.Ref{}) {
		t.Fatal("after the quota was added again, Ref returned the old quota or none")
	}
	if _, _, _, _, ok := fresh.Spend(1); !ok {
		t.Fatal("the new Ref does not spend the new lease")
	}
}
