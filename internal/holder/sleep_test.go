package holder

import (
	"testing"
	"time"
)

// stubClient is never called: these tests run no round.
type stubClient struct{ Client }

// The renewal loop sleeps until its next round is due, within [Tick,
// maxSleep]: not a second whatever is due (an idle agent must not wake
// fifty times a second, nor a held spend's repayment, due in 100ms, wait
// a second longer than it must).
func TestSleepUntilDue(t *testing.T) {
	const t0 = int64(1_000_000_000)
	tests := []struct {
		name    string
		heldEnd int64 // µs after t0; 0: no held spend
		want    time.Duration
	}{
		{"a hold ends in 100ms", 100_000, 100 * time.Millisecond},
		{"a hold ends in 5ms: at least Tick", 5_000, 20 * time.Millisecond},
		{"a hold ends in 1h: at most maxSleep", 3_600_000_000, maxSleep},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := New(Options{Holder: "a", Client: stubClient{}, Clock: func() int64 { return t0 }})
			if err != nil {
				t.Fatal(err)
			}
			l.nextScan, l.retryAt = t0+3_600_000_000, 0 // nothing else due for an hour
			l.held.add(heldLoan{end: t0 + tt.heldEnd})
			if got := l.sleep(); got != tt.want {
				t.Fatalf("sleep() = %v, want %v", got, tt.want)
			}
		})
	}
}
