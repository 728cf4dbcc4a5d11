package header

import (
	"math"
	"net/http"
	"testing"
	"time"
)

func TestSeconds(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want int64
	}{
		{0, 0}, {-time.Second, 0}, {time.Nanosecond, 1}, {time.Second, 1},
		{time.Second + time.Millisecond, 2}, {1500 * time.Millisecond, 2}, {10 * time.Second, 10},
		// The longest durations round up without overflowing.
		{math.MaxInt64, math.MaxInt64/int64(time.Second) + 1}, {math.MaxInt64 - time.Second + 1, math.MaxInt64 / int64(time.Second)},
	}
	for _, tt := range tests {
		if got := Seconds(tt.in); got != tt.want {
			t.Errorf("Seconds(%v) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

func TestFields(t *testing.T) {
	tests := []struct {
		name                     string
		q                        Quota
		policy, value, retryWant string
	}{
		{
			// The draft's own shape: a quota of 100 over 10 s, 50 left, full in 30 s.
			name:   "draft example shape",
			q:      Quota{Policy: "default", Limit: 100, Rate: 10, Remaining: 50, Reset: 30 * time.Second},
			policy: `"default";q=100;w=10`, value: `"default";r=50;t=30`,
		},
		{
			name:   "denied with fractional wait rounds up",
			q:      Quota{Policy: "tenant-search", Limit: 100, Rate: 3, Remaining: 0.4, Reset: 33*time.Second + time.Millisecond, RetryAfter: 200 * time.Millisecond},
			policy: `"tenant-search";q=100;w=34`, value: `"tenant-search";r=0;t=34`, retryWant: "1",
		},
		{
			name:   "fixed allowance has no window and no retry",
			q:      Quota{Policy: "once", Limit: 5, Rate: 0, Remaining: 0},
			policy: `"once";q=5`, value: `"once";r=0;t=0`,
		},
		{
			name:   "quotes escaped",
			q:      Quota{Policy: `a"b`, Limit: 1, Rate: 1},
			policy: `"a\"b";q=1;w=1`, value: `"a\"b";r=0;t=0`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			h.Set("Retry-After", "99")
			Set(h, tt.q)
			if got := h.Get("RateLimit-Policy"); got != tt.policy {
				t.Errorf("RateLimit-Policy = %s, want %s", got, tt.policy)
			}
			if got := h.Get("RateLimit"); got != tt.value {
				t.Errorf("RateLimit = %s, want %s", got, tt.value)
			}
			if got := h.Get("Retry-After"); got != tt.retryWant {
				t.Errorf("Retry-After = %q, want %q", got, tt.retryWant)
			}
		})
	}
}
