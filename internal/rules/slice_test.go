package rules

import (
	"fmt"
	"strings"
	"testing"
)

// TestLeaseSliceUnits holds lease.min_slice and lease.max_slice to their
// one meaning: a holder's rate share in tokens/s, bounded by the rule's
// rate (burst/period when the rate is 0), never by its burst.
func TestLeaseSliceUnits(t *testing.T) {
	tests := []struct {
		name  string
		burst float64
		rate  string
		lease string // the lease mapping's fields
		match string // default {endpoint: export}
		// want is "" when the rule must be accepted, otherwise fragments
		// of the one expected problem, in order.
		want []string
	}{
		{name: "min below rate, above burst", burst: 5, rate: "100", lease: "min_slice: 10"},
		{name: "min above rate, below burst", burst: 1000, rate: "10", lease: "min_slice: 50",
			want: []string{"rules[0].lease.min_slice: ", "50 tokens/s exceeds rate 10 tokens/s"}},
		{name: "min equal to rate", burst: 1000, rate: "10", lease: "min_slice: 10"},
		{name: "min against a per-minute rate", burst: 100, rate: "600/m", lease: "min_slice: 11",
			want: []string{"lease.min_slice: ", "11 tokens/s exceeds rate 10 tokens/s"}},
		{name: "max below rate, above burst", burst: 5, rate: "100", lease: "min_slice: 1, max_slice: 60"},
		{name: "max equal to rate", burst: 1000, rate: "10", lease: "max_slice: 10"},
		{name: "max above rate, below burst", burst: 1000, rate: "10", lease: "max_slice: 200",
			want: []string{"rules[0].lease.max_slice: ", "200 tokens/s exceeds rate 10 tokens/s", "never bind"}},
		{name: "max zero is no cap", burst: 1000, rate: "10", lease: "min_slice: 2, max_slice: 0"},
		{name: "max below min", burst: 1000, rate: "10", lease: "min_slice: 5, max_slice: 2",
			want: []string{"lease.max_slice: ", "2 is below min_slice 5"}},
		// Rate 0: caps are sized by slice x period, so the bound is
		// burst/period: 100 tokens over 10s is 10 tokens/s.
		{name: "rate 0, min within burst/period", burst: 100, rate: "0", lease: "period: 10s, min_slice: 10"},
		{name: "rate 0, min above burst/period", burst: 100, rate: "0", lease: "period: 10s, min_slice: 11",
			want: []string{"lease.min_slice: ", "11 tokens/s exceeds burst 100 over the lease period 10s (rate is 0), 10 tokens/s"}},
		{name: "rate 0, max above burst/period", burst: 100, rate: "0", lease: "period: 10s, max_slice: 20",
			want: []string{"lease.max_slice: ", "20 tokens/s exceeds burst 100"}},
		// default_share scales rate and slices by the same f, so the
		// check on the whole rule holds for both parts.
		{name: "default share, min within rate", burst: 10, rate: "100", lease: "default_share: 0.5, min_slice: 100",
			match: `{user: "*"}`},
		{name: "default share, min above rate", burst: 1000, rate: "10", lease: "default_share: 0.5, min_slice: 11",
			match: `{user: "*"}`, want: []string{"lease.min_slice: ", "11 tokens/s exceeds rate 10 tokens/s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			match := tt.match
			if match == "" {
				match = "{endpoint: export}"
			}
			src := fmt.Sprintf("rules:\n- name: r\n  match: %s\n  burst: %v\n  rate: %s\n  mode: leased\n  lease: {%s}\n",
				match, tt.burst, tt.rate, tt.lease)
			_, err := Parse("f.yaml", []byte(src))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Parse refused a valid rule:\n%s\n%v", src, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse accepted:\n%s\nwant a problem %q", src, tt.want)
			}
			ps := problems(t, err)
			if len(ps) != 1 {
				t.Fatalf("Parse = %v, want exactly one problem %q", err, tt.want)
			}
			msg, rest := ps[0].Error(), ps[0].Error()
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("problem %q lacks %q (in order %q)", msg, w, tt.want)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}
