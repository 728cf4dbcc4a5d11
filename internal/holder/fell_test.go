package holder

import (
	"math"
	"testing"
	"time"
)

// fell: a demand that fell to below half of the last report is noticed on
// the tokens asked for since the report, as soon as the shortfall is beyond
// noise, and the early renewal then reports the new demand.
func TestFell(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	tests := []struct {
		name     string
		reported float64 // tokens/s at the report
		now      float64 // tokens/s since it
		after    time.Duration
		isDef    bool
		want     bool
	}{
		// The case a hierarchy test caught: 29/s reported, 10/s since.
		// Below 32/s, requiring 8 tokens per 250ms window never fired.
		{"29 to 10, too soon to tell", 29, 10, 300 * time.Millisecond, false, false},
		{"29 to 10, after 0.6s", 29, 10, 600 * time.Millisecond, false, true},
		{"32 to 0 within a window", 32, 0, 250 * time.Millisecond, false, true},
		{"80 to 0 before a window", 80, 0, 200 * time.Millisecond, false, false},
		{"steady", 40, 40, 5 * time.Second, false, false},
		{"down a third", 30, 20, 5 * time.Second, false, false},
		{"slow subject, quiet for a second", 4, 0, time.Second, false, false},
		{"slow subject, quiet for two seconds", 4, 0, 2 * time.Second, false, true},
		{"nothing reported", 0, 0, 10 * time.Second, false, false},
		{"a rule's default quota", 100, 0, 10 * time.Second, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := &quota{isDefault: tt.isDef, rate: 100}
			q.demand, q.reportedAt = tt.reported, 0
			q.recent, q.sampledAt = tt.reported, 0
			el := tt.after.Seconds()
			q.sinceReport = math.Floor(tt.now * el)
			q.requested = q.sinceReport
			now := int64(el * float64(sec))
			if got := q.fell(now); got != tt.want {
				t.Fatalf("fell after %v (reported %v/s, %v tokens since) = %v, want %v", tt.after, tt.reported, q.sinceReport, got, tt.want)
			}
			if !tt.want {
				return
			}
			// The estimate starts over from what arrived since the report.
			if d := q.report(now); math.Abs(d-tt.now) > tt.now*0.1+1 {
				t.Errorf("reported %v/s after the fall, want about %v/s", d, tt.now)
			}
			if q.sinceReport != 0 {
				t.Errorf("sinceReport %v after a report, want 0", q.sinceReport)
			}
		})
	}
}
