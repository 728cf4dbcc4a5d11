package agent

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/rules"
)

// A promotion's mark is spent only within what the store said it lasts:
// never at or after sentAt + For on the agent's clock (less the drift and
// pause allowances), whatever For is. TestHotHandOverProperty shows the
// consequence (no overshoot across hand-overs) but draws a new seed each
// run and may miss a mark kept too long; this checks the mark itself.
func TestHotMarkEndsWithinItsFor(t *testing.T) {
	rule := &rules.Rule{Name: "q", Burst: 10, Rate: 10, Mode: rules.ModeAuto,
		Auto: rules.Auto{PromoteAbove: 20, DemoteBelow: 5, Hold: time.Second}}
	for _, forUs := range []int64{200_000, 1_000_000, 30_000_000} {
		keys := newHotKeys("", func() int64 { return 0 }, newMetrics(prometheus.NewRegistry()))
		st := &step{rule: rule, subject: "s", req: bucket.Request{Key: "k", Limit: bucket.Limit{Burst: 10, Rate: 10}, Cost: 1}}
		const sentAt = int64(5_000_000)
		if keys.adopt(st, bucket.Promotion{Epoch: 1, For: forUs}, sentAt) == nil {
			t.Fatalf("For %dµs: mark not adopted", forUs)
		}
		if keys.spendable("k", sentAt+1) == nil {
			t.Errorf("For %dµs: mark not spendable right after it was sent", forUs)
		}
		if keys.spendable("k", sentAt+forUs) != nil {
			t.Errorf("For %dµs: mark still spendable at sentAt + For: spent past what the store allowed", forUs)
		}
	}
}
