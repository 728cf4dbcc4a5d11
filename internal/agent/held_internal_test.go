package agent

import (
	"testing"
	"time"
)

// What a lease can fund (µs of its clock) turns into the longest spend
// whose hold fits in it: heldFor of it is within the funds, and a spend
// a millisecond longer is not. An RLQS take sized by it is not refused
// again for its hold's length.
func TestSpendWithinFitsHold(t *testing.T) {
	for _, fund := range []int64{1_600_000, 1_942_000, 2_509_800, 9_000_000} {
		s := spendWithin(fund)
		if h := heldFor(s); h > fund {
			t.Errorf("fund %dµs: spend %v is held for %dµs, more than the fund", fund, s, h)
		}
		if h := heldFor(s + time.Millisecond); h <= fund {
			t.Errorf("fund %dµs: spend %v is not the longest that fits (%v more is held %dµs)", fund, s, time.Millisecond, h)
		}
	}
	if s := spendWithin(hotPause.Microseconds() - 1); s != 0 {
		t.Errorf("a fund shorter than the pause allowance funds a spend of %v", s)
	}
}
