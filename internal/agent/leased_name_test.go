package agent_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/rules"
)

// The leased quota id checks, at the Service: what the coordinator would
// refuse (over 256 bytes, not UTF-8; the gRPC and JSON decoders cannot
// even carry the latter) is invalid before any step is charged; a Redis
// rule takes the same subjects.
func TestLeasedQuotaIDChecks(t *testing.T) {
	set, err := rules.Parse("names.yaml", []byte(`
rules:
  - {name: leased-r, match: {k: "*"}, burst: 10, rate: 1, mode: leased, lease: {period: 1s}}
  - {name: redis-r, match: {k: "*"}, burst: 10, rate: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := agent.New(agent.Options{Rules: agent.StaticRules{Set: set}, Store: bucket.NewMemoryStore(nil), DecisionTimeout: 50e6})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, rule, subject string
		invalid             bool
	}{
		{"leased, quota id 256 bytes", "leased-r", strings.Repeat("s", 256-len("leased-r|")), false},
		{"leased, quota id 257 bytes", "leased-r", strings.Repeat("s", 257-len("leased-r|")), true},
		{"leased, not UTF-8", "leased-r", "a\xffb", true},
		{"redis, 256-byte subject", "redis-r", strings.Repeat("s", 256), false},
		{"redis, not UTF-8", "redis-r", "a\xffb", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := svc.Decide(context.Background(), agent.Request{Rule: tt.rule, Subject: tt.subject})
			if got := errors.Is(err, agent.ErrInvalidRequest); got != tt.invalid {
				t.Fatalf("Decide = %v, want invalid=%v", err, tt.invalid)
			}
			if tt.invalid && !strings.Contains(err.Error(), tt.rule) {
				t.Fatalf("error %q does not name the rule", err)
			}
		})
	}
}
