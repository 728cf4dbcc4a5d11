package lease

import "testing"

// GrantBound: caps and rates past the rule are held to it; deposits to a
// bucket of the rule's shape, full at the first grant, refilled at the
// rule's rate, credited with what is given back; no shape clamps nothing.
func TestGrantBound(t *testing.T) {
	type grant struct {
		now                int64
		credit             float64 // given back before this grant
		cap, rate, balance float64
		wantCap, wantRate  float64
		wantBalance        float64
		wantOver           bool
	}
	for _, tc := range []struct {
		name        string
		burst, rate float64
		grants      []grant
	}{
		{"within the rule", 50, 20, []grant{
			{now: 0, cap: 50, rate: 20, balance: 50, wantCap: 50, wantRate: 20, wantBalance: 50},
			{now: 1e6, cap: 50, rate: 20, balance: 20, wantCap: 50, wantRate: 20, wantBalance: 20},
		}},
		{"cap and rate past the rule", 50, 20, []grant{
			{now: 0, cap: 1000, rate: 500, balance: 10, wantCap: 50, wantRate: 20, wantBalance: 10, wantOver: true},
		}},
		{"top-ups past the refill", 50, 20, []grant{
			{now: 0, cap: 50, rate: 20, balance: 50, wantCap: 50, wantRate: 20, wantBalance: 50},
			{now: 5e5, cap: 50, rate: 20, balance: 50, wantCap: 50, wantRate: 20, wantBalance: 10, wantOver: true},
			{now: 1e6, cap: 50, rate: 20, balance: 50, wantCap: 50, wantRate: 20, wantBalance: 10, wantOver: true},
		}},
		{"given back, granted again", 50, 20, []grant{
			{now: 0, cap: 50, rate: 20, balance: 50, wantCap: 50, wantRate: 20, wantBalance: 50},
			{now: 0, credit: 30, cap: 50, rate: 20, balance: 30, wantCap: 50, wantRate: 20, wantBalance: 30},
		}},
		{"rate 0", 50, 0, []grant{
			{now: 0, cap: 50, rate: 5, balance: 50, wantCap: 50, wantRate: 0, wantBalance: 50, wantOver: true},
			{now: 1e6, cap: 50, rate: 0, balance: 1, wantCap: 50, wantRate: 0, wantBalance: 0, wantOver: true},
		}},
		{"no shape", 0, 0, []grant{
			{now: 0, cap: 1e6, rate: 1e6, balance: 1e6, wantCap: 1e6, wantRate: 1e6, wantBalance: 1e6},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b GrantBound
			for i, g := range tc.grants {
				b.Credit(g.credit, tc.burst)
				l := Lease{Cap: g.cap, Rate: g.rate, Balance: g.balance}
				over := b.Clamp(g.now, tc.burst, tc.rate, &l)
				if l.Cap != g.wantCap || l.Rate != g.wantRate || l.Balance != g.wantBalance || over != g.wantOver {
					t.Errorf("grant %d: cap %v rate %v balance %v over %v, want %v %v %v %v",
						i, l.Cap, l.Rate, l.Balance, over, g.wantCap, g.wantRate, g.wantBalance, g.wantOver)
				}
			}
		})
	}
}
