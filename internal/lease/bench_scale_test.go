package lease

import (
	"fmt"
	"testing"
)

// BenchmarkRenewHolders measures one renewal (one item) in a quota held by
// n holders, each renewing in turn with a demand that changes every time,
// so that every renewal sizes its lease against all the others' demands:
// what a coordinator pays per renewal when every agent holds the same quota.
// Demands sum above the rate, so the shares are water-filled, not simply
// every holder's demand. With steady, every holder reports the same demand
// at every renewal (as the coordinator's RenewScale benchmark does): only
// the lease's expiry moves in the quota's trees.
func BenchmarkRenewHolders(b *testing.B) {
	for _, steady := range []bool{false, true} {
		for _, n := range []int{1, 100, 1000, 10_000} {
			name := fmt.Sprintf("holders=%d", n)
			if steady {
				name = fmt.Sprintf("steady/holders=%d", n)
			}
			b.Run(name, func(b *testing.B) { renewHolders(b, n, steady) })
		}
	}
}

func renewHolders(b *testing.B, n int, steady bool) {
	s := New()
	must := func(c Command) Result { return applyOK(b, s, c) }
	must(ConfigureQuota{Quota: "q", Burst: 1e6, Rate: 1e5, LeasePeriod: MaxPeriod, SafetyMargin: sec})
	rate := 1e5 / float64(n)
	items := make([]RenewItem, n)
	seq := make([]uint64, n)
	var now int64
	for i := range n {
		seq[i] = 1
		l := must(Grant{Now: now, Holder: fmt.Sprintf("h%d", i), Seq: 1, Quota: "q", Demand: rate * float64(i%7+1) / 3}).Lease
		items[i] = RenewItem{LeaseID: l.ID, Quota: "q", ConfirmedCap: l.Cap, ConfirmedRate: l.Rate}
	}
	b.ReportAllocs()
	b.ResetTimer()
	i, k := 0, 0
	for b.Loop() {
		now += 10
		seq[i]++
		it := items[i]
		it.Demand = rate * float64((i+k)%7+1) / 3
		if steady {
			it.Demand = rate * float64(i%7+1) / 3
		}
		r := must(Renew{Now: now, Holder: fmt.Sprintf("h%d", i), Seq: seq[i], Items: []RenewItem{it}})
		l := r.Items[0].Lease
		if l == nil {
			b.Fatalf("holder %d: %v", i, r.Items[0].Err)
		}
		items[i].ConfirmedCap, items[i].ConfirmedRate = l.Cap, l.Rate
		if i++; i == n {
			i, k = 0, k+1
		}
	}
}
