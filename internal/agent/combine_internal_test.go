package agent

import (
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/rules"
)

// A denial always says when to retry when its rule refills: a lease
// granted empty (the rule's tokens with other agents) answered 429 with
// RateLimit r=0;t=0 and no Retry-After.
func TestDenialSaysWhenToRetry(t *testing.T) {
	for _, c := range []struct {
		name        string
		rate, cost  float64
		retry, want time.Duration
		reason      Reason
	}{
		{"the bucket's own advice", 10, 1, 300 * time.Millisecond, 300 * time.Millisecond, ReasonOverLimit},
		{"a lease granted empty", 10, 1, 0, 100 * time.Millisecond, ReasonOverLimit},
		{"a cost of 5 at 2/s", 2, 5, 0, 2500 * time.Millisecond, ReasonOverLimit},
		{"a rule that never refills", 0, 1, 0, 0, ReasonOverLimit},
		{"unreachable (503 advice is the caller's)", 10, 1, 0, 0, ReasonUnavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := &step{rule: &rules.Rule{Name: "r"}, req: bucket.Request{Cost: c.cost, Limit: bucket.Limit{Burst: 10, Rate: c.rate}},
				res: bucket.Result{RetryAfter: c.retry}}
			var dst Response
			respond(&dst, st, false, c.reason)
			if dst.RetryAfter != c.want {
				t.Fatalf("RetryAfter %v, want %v", dst.RetryAfter, c.want)
			}
			if dst.Reset < dst.RetryAfter {
				t.Fatalf("Reset %v before RetryAfter %v", dst.Reset, dst.RetryAfter)
			}
		})
	}
}
