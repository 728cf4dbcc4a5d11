package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// fill splits outcomes into allowed, denied and errors by reason, and
// decided/s leaves out what no bucket decided.
func TestReportFill(t *testing.T) {
	sh := newShard(false)
	tl := tally{}
	tl.add(kindAllowed, "ok", 600)
	tl.add(kindAllowed, "no_rule", 50)
	tl.add(kindAllowed, "unavailable", 10) // fail_open
	tl.add(kindAllowed, "emergency", 20)
	tl.add(kindDenied, "over_limit", 200)
	tl.add(kindDenied, "unavailable", 70) // fail_closed
	tl.add(kindError, "grpc:DeadlineExceeded", 50)
	sh.add(time.Millisecond, 1000, tl)

	r := &Report{Batch: 1000}
	r.fill(merge([]*shard{sh}), 2*time.Second)
	if r.Decisions != 1000 || r.Allowed != 680 || r.Denied != 270 || r.Errors != 50 {
		t.Errorf("decisions %d = allowed %d + denied %d + errors %d; want 1000 = 680 + 270 + 50", r.Decisions, r.Allowed, r.Denied, r.Errors)
	}
	if r.FailurePolicy != 100 || r.NoRule != 50 {
		t.Errorf("failure policy %d, no rule %d; want 100 and 50", r.FailurePolicy, r.NoRule)
	}
	if r.DecisionsPerSec != 500 || r.DecidedPerSec != 400 { // (1000 - 50 - 100 - 50) / 2s
		t.Errorf("decisions/s %v, decided/s %v; want 500 and 400", r.DecisionsPerSec, r.DecidedPerSec)
	}
	if r.DeniedByReason["unavailable"] != 70 || r.AllowedByReason["unavailable"] != 10 || r.ErrorsByReason["grpc:DeadlineExceeded"] != 50 {
		t.Errorf("by reason: %v %v %v", r.AllowedByReason, r.DeniedByReason, r.ErrorsByReason)
	}
	var buf bytes.Buffer
	if err := r.writeText(&buf); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"failure policy", "ok 600, no_rule 50, emergency 20, unavailable 10", "over_limit 200, unavailable 70"} {
		if !strings.Contains(buf.String(), w) {
			t.Errorf("text report lacks %q:\n%s", w, buf.String())
		}
	}
}

func TestGroup(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -45678: "-45,678"} {
		if got := group(n); got != want {
			t.Errorf("group(%d) = %q, want %q", n, got, want)
		}
	}
}
