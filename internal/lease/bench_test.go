package lease

import (
	"encoding/json"
	"fmt"
	"testing"
)

// BenchmarkRenew measures one agent renewing 100 leases (one per quota) in
// one command, each quota shared with other holders.
func BenchmarkRenew(b *testing.B) {
	for _, others := range []int{1, 100} {
		b.Run(fmt.Sprintf("items=100/others=%d", others), func(b *testing.B) {
			s := New()
			must := func(c Command) Result { return applyOK(b, s, c) }
			renew := Renew{Holder: "agent", Seq: 1}
			for q := range 100 {
				name := fmt.Sprintf("q%d", q)
				must(ConfigureQuota{Quota: name, Burst: 1000, Rate: 100, LeasePeriod: MaxPeriod, SafetyMargin: sec})
				for o := range others {
					must(Grant{Holder: fmt.Sprintf("other%d", o), Seq: uint64(q + 1), Quota: name, Demand: 10})
				}
				l := must(Grant{Holder: "agent", Seq: renew.Seq, Quota: name, Demand: 10}).Lease
				renew.Seq++
				renew.Items = append(renew.Items, RenewItem{LeaseID: l.ID, Quota: name, Demand: 10, ConfirmedCap: l.Cap, ConfirmedRate: l.Rate})
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				renew.Now += 1000
				r := must(renew)
				renew.Seq++
				for i, it := range r.Items {
					renew.Items[i].ConfirmedCap, renew.Items[i].ConfirmedRate = it.Lease.Cap, it.Lease.Rate
				}
			}
		})
	}
}

// BenchmarkGrant measures a grant in a quota of n holders (a renewal in
// place, so the state does not grow with b.N).
func BenchmarkGrant(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("holders=%d", n), func(b *testing.B) {
			s := New()
			if _, err := s.Apply(ConfigureQuota{Quota: "q", Burst: 1e6, Rate: 1e4, LeasePeriod: MaxPeriod, SafetyMargin: sec}); err != nil {
				b.Fatal(err)
			}
			seq := make([]uint64, n)
			var now int64
			grant := func(i int) {
				seq[i]++
				now += 1000
				if _, err := s.Apply(Grant{Now: now, Holder: fmt.Sprintf("h%d", i), Seq: seq[i], Quota: "q", Demand: float64(i%7 + 1)}); err != nil {
					b.Fatal(err)
				}
			}
			for i := range n {
				grant(i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				grant(i % n)
				i++
			}
		})
	}
}

// BenchmarkTick measures a Tick over n quotas that each hold one live
// lease (nothing to reclaim, nothing idle): its cost per live quota.
func BenchmarkTick(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("quotas=%d", n), func(b *testing.B) {
			s := New()
			cfg := &QuotaConfig{Burst: 100, Rate: 10, LeasePeriod: MaxPeriod, SafetyMargin: sec}
			for i := range n {
				if _, err := s.Apply(Grant{Holder: "agent", Seq: uint64(i + 1), Quota: fmt.Sprintf("q%d", i), Demand: 1, Config: cfg}); err != nil {
					b.Fatal(err)
				}
			}
			tick := Tick{}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				tick.Now += 1000
				if _, err := s.Apply(tick); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeRenew decodes a one-item renewal, as every replica does
// for every renewal it applies: JSON (version 1, logs written before
// version 4) and binary (version 4, what EncodeCommand writes).
//
//	go test -run '^$' -bench DecodeRenew ./internal/lease/
func BenchmarkDecodeRenew(b *testing.B) {
	r := Renew{Now: 1_800_000_000_000_000, Holder: "agent-17/3f9c2a71d04e8b65", Seq: 123456, Items: []RenewItem{{
		LeaseID: 4242, Quota: "per-tenant|shared", Unused: 0.75, Demand: 12.5, ConfirmedCap: 100, ConfirmedRate: 10,
	}}}
	js, err := json.Marshal(r)
	if err != nil {
		b.Fatal(err)
	}
	bin, err := EncodeCommand(r)
	if err != nil {
		b.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		enc  []byte
	}{{"json", append([]byte{byte(KindRenew), 1}, js...)}, {"binary", bin}} {
		b.Run(tt.name, func(b *testing.B) {
			b.ReportAllocs()
			b.ReportMetric(float64(len(tt.enc)), "bytes")
			for b.Loop() {
				if _, err := DecodeCommand(tt.enc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// applyOK applies c to s, failing the benchmark on an error.
func applyOK(b *testing.B, s *State, c Command) Result {
	b.Helper()
	r, err := s.Apply(c)
	if err != nil {
		b.Fatal(err)
	}
	return r
}
