package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// view is a Rule's exported fields, comparable with reflect.DeepEqual
// without the compiled matcher.
type view struct {
	Name        string
	Match       map[string]string
	Burst, Rate float64
	Mode        Mode
	OnFailure   Policy
	Emergency   EmergencyLimit
	Shadow      bool
	Lease       Lease
	Line        int
}

func viewOf(r *Rule) view {
	return view{r.Name, r.Match, r.Burst, r.Rate, r.Mode, r.OnFailure, r.Emergency, r.Shadow, r.Lease, r.Line}
}

func mustParse(t *testing.T, src string) *Set {
	t.Helper()
	s, err := Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return s
}

// problems splits a Parse error into its problems.
func problems(t *testing.T, err error) []*Problem {
	t.Helper()
	if err == nil {
		t.Fatal("Parse succeeded, want an error")
	}
	if !errors.Is(err, ErrInvalidFile) {
		t.Errorf("error %v does not wrap ErrInvalidFile", err)
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("error %T is not a joined error", err)
	}
	var ps []*Problem
	for _, e := range j.Unwrap() {
		var p *Problem
		if !errors.As(e, &p) {
			t.Fatalf("%v is not a *Problem", e)
		}
		ps = append(ps, p)
	}
	return ps
}

func TestLoadSample(t *testing.T) {
	s, err := Load("testdata/sample.yaml")
	if err != nil {
		t.Fatalf("Load(sample) = %v", err)
	}
	want := []view{
		{Name: "tenant-search", Match: map[string]string{"tenant": "*", "endpoint": "search"}, Burst: 100, Rate: 10,
			Mode: ModeRedis, OnFailure: FailClosed, Line: 6},
		{Name: "user-login", Match: map[string]string{"user": "*", "endpoint": "login"}, Burst: 10, Rate: 1,
			OnFailure: Emergency, Emergency: EmergencyLimit{Burst: 5, Rate: 1, MaxDuration: 30 * time.Second}, Line: 15},
		{Name: "tenant-search-strict", Match: map[string]string{"tenant": "*", "endpoint": "search"}, Burst: 20, Rate: 2,
			Shadow: true, Line: 25},
		{Name: "export-global", Match: map[string]string{"endpoint": "export"}, Burst: 1000, Rate: 10, Mode: ModeLeased,
			OnFailure: Emergency, Emergency: EmergencyLimit{Burst: 2, Rate: 0.5, MaxDuration: time.Minute},
			Lease: Lease{Period: 10 * time.Second, MinSlice: 5, MaxSlice: 8}, Line: 32},
	}
	rules := s.Rules()
	if len(rules) != len(want) {
		t.Fatalf("Load(sample) has %d rules, want %d", len(rules), len(want))
	}
	for i, r := range rules {
		if got := viewOf(r); !reflect.DeepEqual(got, want[i]) {
			t.Errorf("rule %d = %+v, want %+v", i, got, want[i])
		}
		if byName, ok := s.Rule(r.Name); !ok || byName != r {
			t.Errorf("Rule(%q) = %p, %v, want %p, true", r.Name, byName, ok, r)
		}
	}
	if r, ok := s.Rule("nope"); ok || r != nil {
		t.Errorf("Rule(nope) = %v, %v, want nil, false", r, ok)
	}
	data, err := os.ReadFile("testdata/sample.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if got, want := s.Hash(), hex.EncodeToString(sum[:])[:16]; got != want {
		t.Errorf("Hash() = %q, want %q (sha256sum prefix)", got, want)
	}
}

// TestRoundTrip writes rules back out as YAML and parses them again: what
// Parse understood is what the fields say.
func TestRoundTrip(t *testing.T) {
	s, err := Load("testdata/sample.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("rules:\n")
	for _, r := range s.Rules() {
		fmt.Fprintf(&b, "- name: %s\n  match:\n", r.Name)
		for k, v := range r.Match {
			fmt.Fprintf(&b, "    %q: %q\n", k, v)
		}
		fmt.Fprintf(&b, "  burst: %v\n  rate: %v\n  mode: %v\n  on_failure: %v\n  shadow: %v\n", r.Burst, r.Rate, r.Mode, r.OnFailure, r.Shadow)
		if r.OnFailure == Emergency {
			fmt.Fprintf(&b, "  emergency: {burst: %v, rate: %v, max_duration: %v}\n", r.Emergency.Burst, r.Emergency.Rate, r.Emergency.MaxDuration)
		}
		if r.Mode == ModeLeased {
			fmt.Fprintf(&b, "  lease: {period: %v, min_slice: %v, max_slice: %v, max_subjects: %d, default_share: %v}\n", r.Lease.Period, r.Lease.MinSlice, r.Lease.MaxSlice, r.Lease.MaxSubjects, r.Lease.DefaultShare)
		}
	}
	again := mustParse(t, b.String())
	a, c := s.Rules(), again.Rules()
	if len(a) != len(c) {
		t.Fatalf("round trip has %d rules, want %d", len(c), len(a))
	}
	for i := range a {
		x, y := viewOf(a[i]), viewOf(c[i])
		x.Line, y.Line = 0, 0
		if !reflect.DeepEqual(x, y) {
			t.Errorf("round trip rule %d = %+v, want %+v", i, y, x)
		}
	}
	if s.Hash() == again.Hash() {
		t.Errorf("different files share Hash %q", s.Hash())
	}
}

func TestParseValid(t *testing.T) {
	const head = "rules:\n- name: r\n  match: {k: v}\n  burst: 10\n"
	tests := []struct {
		name string
		src  string
		want func(*Rule) string // "" when the rule is as expected
	}{
		{"defaults", head + "  rate: 1\n", func(r *Rule) string {
			if r.Mode != ModeRedis || r.OnFailure != FailClosed || r.Shadow || r.Lease != (Lease{}) || r.Emergency != (EmergencyLimit{}) {
				return fmt.Sprintf("defaults = %+v", viewOf(r))
			}
			return ""
		}},
		{"rate number", head + "  rate: 2.5\n", rateIs(2.5)},
		{"rate zero", head + "  rate: 0\n", rateIs(0)},
		{"rate per second", head + "  rate: 10/s\n", rateIs(10)},
		{"rate per minute", head + "  rate: 600/m\n", rateIs(10)},
		{"rate per hour", head + "  rate: \"36000/h\"\n", rateIs(10)},
		{"rate with spaces and fraction", head + "  rate: 1.5 / s\n", rateIs(1.5)},
		{"rate max", head + "  rate: 1e12\n", rateIs(1e12)},
		{"leased default lease", head + "  rate: 1\n  mode: leased\n", leaseIs(Lease{Period: DefaultLeasePeriod})},
		{"leased partial lease", head + "  rate: 2\n  mode: leased\n  lease: {min_slice: 2}\n", leaseIs(Lease{Period: DefaultLeasePeriod, MinSlice: 2})},
		{"leased uncapped", head + "  rate: 10\n  mode: leased\n  lease: {period: 1m, min_slice: 10, max_slice: 0}\n", leaseIs(Lease{Period: time.Minute, MinSlice: 10})},
		{"leased max subjects", head + "  rate: 1\n  mode: leased\n  lease: {max_subjects: 50000}\n", leaseIs(Lease{Period: DefaultLeasePeriod, MaxSubjects: 50000})},
		{"leased default share", "rules:\n- name: r\n  match: {user: \"*\"}\n  burst: 10\n  rate: 1\n  mode: leased\n  lease: {default_share: 0.25}\n", leaseIs(Lease{Period: DefaultLeasePeriod, DefaultShare: 0.25})},
		{"leased default share whole", "rules:\n- name: r\n  match: {user: \"*\", k: v}\n  burst: 10\n  rate: 1\n  mode: leased\n  lease: {default_share: 1}\n", leaseIs(Lease{Period: DefaultLeasePeriod, DefaultShare: 1})},
		{"fail open", head + "  rate: 1\n  on_failure: fail_open\n", func(r *Rule) string {
			if r.OnFailure != FailOpen {
				return fmt.Sprintf("OnFailure = %v", r.OnFailure)
			}
			return ""
		}},
		{"emergency rate string", head + "  rate: 1\n  on_failure: emergency\n  emergency: {burst: 3, rate: 60/m, max_duration: 1m30s}\n", func(r *Rule) string {
			if want := (EmergencyLimit{Burst: 3, Rate: 1, MaxDuration: 90 * time.Second}); r.Emergency != want {
				return fmt.Sprintf("Emergency = %+v, want %+v", r.Emergency, want)
			}
			return ""
		}},
		{"match values as written", "rules:\n- name: r\n  match: {status: 404, ok: true, ratio: 0.50, '*k': '*'}\n  burst: 1\n  rate: 1\n", func(r *Rule) string {
			if want := map[string]string{"status": "404", "ok": "true", "ratio": "0.50", "*k": "*"}; !reflect.DeepEqual(r.Match, want) {
				return fmt.Sprintf("Match = %v, want %v", r.Match, want)
			}
			return ""
		}},
		{"anchors inside rules", "rules:\n- name: a\n  match: &m {tenant: '*'}\n  burst: 1\n  rate: 1\n- name: r\n  match: *m\n  burst: 2\n  rate: 1\n", func(r *Rule) string {
			if r.Match["tenant"] != "*" || r.Burst != 2 {
				return fmt.Sprintf("aliased rule = %+v", viewOf(r))
			}
			return ""
		}},
		{"shadow", head + "  rate: 1\n  shadow: true\n", func(r *Rule) string {
			if !r.Shadow {
				return "Shadow = false"
			}
			return ""
		}},
		{"name limits", "rules:\n- name: " + "0" + strings.Repeat("a_.-", 15) + "xy\n  match: {k: v}\n  burst: 1\n  rate: 1\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustParse(t, tt.src)
			rules := s.Rules()
			r := rules[len(rules)-1]
			if tt.want != nil {
				if msg := tt.want(r); msg != "" {
					t.Error(msg)
				}
			}
			if ps := r.validate(); len(ps) != 0 {
				t.Errorf("parsed rule fails validate: %v", ps)
			}
		})
	}
}

func rateIs(want float64) func(*Rule) string {
	return func(r *Rule) string {
		if r.Rate != want {
			return fmt.Sprintf("Rate = %v, want %v", r.Rate, want)
		}
		return ""
	}
}

func leaseIs(want Lease) func(*Rule) string {
	return func(r *Rule) string {
		if r.Lease != want {
			return fmt.Sprintf("Lease = %+v, want %+v", r.Lease, want)
		}
		return ""
	}
}

func TestParseEmptyRulesList(t *testing.T) {
	s := mustParse(t, "rules: []\n")
	if n := len(s.Rules()); n != 0 {
		t.Errorf("rules: [] has %d rules", n)
	}
	if got := s.Match(map[string]string{"k": "v"}, nil); len(got) != 0 {
		t.Errorf("Match on no rules = %v", got)
	}
}

// want is one expected problem: its exact "FILE:LINE:COL: field" prefix and
// a fragment of its message.
type want struct{ where, msg string }

func TestParseInvalid(t *testing.T) {
	const ok = "  match: {k: v}\n  burst: 10\n  rate: 1\n"
	rule := func(extra string) string { return "rules:\n- name: r\n" + ok + extra }
	tests := []struct {
		name string
		src  string
		want []want
	}{
		{"empty", "", []want{{"f.yaml: ", "file is empty"}}},
		{"only comments", "# nothing\n", []want{{"f.yaml: ", "file is empty"}}},
		{"syntax", "rules:\n- name: r\n  match: {k: v\n", []want{{"f.yaml:3: ", "YAML syntax error: did not find expected ',' or '}'"}}},
		{"syntax scanner", "rules:\n- name: r\n  match: a: b\n", []want{{"f.yaml:3: ", "YAML syntax error: mapping values are not allowed"}}},
		// The library names where the scalar it was reading began, not the tab.
		{"syntax tab indent", "rules:\n- name: r\n\tmatch: {k: v}\n", []want{{"f.yaml:2: ", "YAML syntax error: found a tab character that violates indentation"}}},
		{"syntax block key", "rules:\n- name: r\n  match: {k: v}\n burst: 1\n", []want{{"f.yaml:4: ", "YAML syntax error: did not find expected key"}}},
		{"invalid utf-8", "rules:\n- name: \"r\xff\"\n", []want{{"f.yaml:2:11: ", "YAML syntax error: invalid"}}},
		{"control character", "rules:\n- name: r\x01\n", []want{{"f.yaml:2:10: ", "YAML syntax error: control characters are not allowed"}}},
		{"unknown anchor", "rules:\n- name: r\n  match: *m\n", []want{{"f.yaml:3:10: ", "YAML error: unknown anchor 'm' referenced"}}},
		{"syntax first line", "a: b: c\n", []want{{"f.yaml:1: ", "YAML syntax error"}}},
		{"second document", "rules: []\n---\nrules: []\n", []want{{"f.yaml:3:1: ", "second YAML document"}}},
		{"not a mapping", "- a\n", []want{{"f.yaml:1:1: ", "must be a mapping with the fields rules, got a list"}}},
		{"rules missing", "other: 1\n", []want{
			{"f.yaml:1:1: other: ", "unknown field; the fields are rules"},
			{"f.yaml:1:1: rules: ", "required"},
		}},
		{"rules null", "rules:\n", []want{{"f.yaml:1:7: rules: ", "must be a list of rules, got nothing (null)"}}},
		{"rule not a mapping", "rules:\n- tenant\n", []want{{"f.yaml:2:3: rules[0]: ", "a rule must be a mapping"}}},
		{"alias cycle", "rules: &a [*a]\n", []want{{"f.yaml:1:8: rules[0]: ", "got a list"}}},
		{"unknown field", rule("  burts: 10\n"), []want{{"f.yaml:6:3: rules[0].burts: ", "unknown field; the fields are name, match, burst"}}},
		{"unknown top-level field", "defaults: &m {k: v}\nrules: []\n", []want{{"f.yaml:1:1: defaults: ", "unknown field"}}},
		{"key set twice", rule("  burst: 5\n"), []want{{"f.yaml:6:3: rules[0].burst: ", "set twice (first at line 4)"}}},
		{"merge key", "rules:\n- <<: {burst: 1}\n  name: r\n" + ok, []want{{"f.yaml:2:3: rules[0]: ", "merge keys (<<) are not supported"}}},
		{"all required missing", "rules:\n- shadow: true\n", []want{
			{"f.yaml:2:3: rules[0].name: ", "required"},
			{"f.yaml:2:3: rules[0].match: ", "required"},
			{"f.yaml:2:3: rules[0].burst: ", "required"},
			{"f.yaml:2:3: rules[0].rate: ", "required"},
		}},
		{"duplicate name", "rules:\n- name: r\n" + ok + "- name: x\n" + ok + "- name: r\n" + ok, []want{
			{"f.yaml:10:9: rules[2].name: ", `duplicate rule name "r"; first defined at line 2 (rules[0])`},
		}},
		{"name uppercase", "rules:\n- name: Tenant\n" + ok, []want{{"f.yaml:2:9: rules[0].name: ", `"Tenant" must match [a-z0-9][a-z0-9_.-]{0,62}`}}},
		{"name hash tag", "rules:\n- name: 'a{b}'\n" + ok, []want{{"f.yaml:2:9: rules[0].name: ", "must match"}}},
		{"name pipe", "rules:\n- name: a|b\n" + ok, []want{{"f.yaml:2:9: rules[0].name: ", "must match"}}},
		{"name leading dash", "rules:\n- name: -a\n" + ok, []want{{"f.yaml:2:9: rules[0].name: ", "must match"}}},
		{"name empty", "rules:\n- name: ''\n" + ok, []want{{"f.yaml:2:9: rules[0].name: ", "must not be empty"}}},
		{"name too long", "rules:\n- name: " + strings.Repeat("a", 64) + "\n" + ok, []want{{"f.yaml:2:9: rules[0].name: ", "is 64 bytes, at most 63"}}},
		{"name a list", "rules:\n- name: [a]\n" + ok, []want{{"f.yaml:2:9: rules[0].name: ", "must be a string, got a list"}}},
		{"match empty", "rules:\n- name: r\n  match: {}\n  burst: 1\n  rate: 1\n", []want{{"f.yaml:3:10: rules[0].match: ", "must have at least one key"}}},
		{"match list", "rules:\n- name: r\n  match: [k]\n  burst: 1\n  rate: 1\n", []want{{"f.yaml:3:10: rules[0].match: ", "must be a mapping of descriptor keys"}}},
		{"match null value", "rules:\n- name: r\n  match: {k: }\n  burst: 1\n  rate: 1\n", []want{{"f.yaml:3:14: rules[0].match.k: ", `value required; use "*"`}}},
		{"match empty value", "rules:\n- name: r\n  match: {k: ''}\n  burst: 1\n  rate: 1\n", []want{{"f.yaml:3:11: rules[0].match.k: ", "value must not be empty"}}},
		{"match empty key", "rules:\n- name: r\n  match: {'': v}\n  burst: 1\n  rate: 1\n", []want{{`f.yaml:3:11: rules[0].match[""]: `, "key must not be empty"}}},
		{"match key twice", "rules:\n- name: r\n  match: {k: v, k: w}\n  burst: 1\n  rate: 1\n", []want{{"f.yaml:3:17: rules[0].match.k: ", "key set twice (first at line 3)"}}},
		{"match too many keys", "rules:\n- name: r\n  match: {" + manyKeys(17) + "}\n  burst: 1\n  rate: 1\n", []want{{"f.yaml:3:10: rules[0].match: ", "has 17 keys, at most 16"}}},
		{"match key too long", "rules:\n- name: r\n  match: {" + strings.Repeat("k", 257) + ": v}\n  burst: 1\n  rate: 1\n", []want{{"f.yaml:3:11: rules[0].match[", "key is 257 bytes, at most 256"}}},
		{"match value too long", "rules:\n- name: r\n  match: {k: " + strings.Repeat("v", 257) + "}\n  burst: 1\n  rate: 1\n", []want{{"f.yaml:3:11: rules[0].match.k: ", "value is 257 bytes, at most 256"}}},
		{"burst zero", "rules:\n- name: r\n  match: {k: v}\n  burst: 0\n  rate: 1\n", []want{{"f.yaml:4:10: rules[0].burst: ", "must be in (0, 1e+12], got 0"}}},
		{"burst negative", "rules:\n- name: r\n  match: {k: v}\n  burst: -1\n  rate: 1\n", []want{{"f.yaml:4:10: rules[0].burst: ", "got -1"}}},
		{"burst huge", "rules:\n- name: r\n  match: {k: v}\n  burst: 1e13\n  rate: 1\n", []want{{"f.yaml:4:10: rules[0].burst: ", "got 1e+13"}}},
		{"burst nan", "rules:\n- name: r\n  match: {k: v}\n  burst: .nan\n  rate: 1\n", []want{{"f.yaml:4:10: rules[0].burst: ", "got NaN"}}},
		{"burst inf", "rules:\n- name: r\n  match: {k: v}\n  burst: .inf\n  rate: 1\n", []want{{"f.yaml:4:10: rules[0].burst: ", "got +Inf"}}},
		{"burst quoted", "rules:\n- name: r\n  match: {k: v}\n  burst: \"100\"\n  rate: 1\n", []want{{"f.yaml:4:10: rules[0].burst: ", `must be a number, got the string "100"`}}},
		{"rate negative", "rules:\n- name: r\n  match: {k: v}\n  burst: 1\n  rate: -1\n", []want{{"f.yaml:5:9: rules[0].rate: ", "must be in [0, 1e+12], got -1"}}},
		{"rate huge string", "rules:\n- name: r\n  match: {k: v}\n  burst: 1\n  rate: 1e13/s\n", []want{{"f.yaml:5:9: rules[0].rate: ", "got 1e+13"}}},
		{"rate unknown unit", "rules:\n- name: r\n  match: {k: v}\n  burst: 1\n  rate: 10/d\n", []want{{"f.yaml:5:9: rules[0].rate: ", `a string like "10/s", "600/m", "36000/h"; got the string "10/d"`}}},
		{"rate words", "rules:\n- name: r\n  match: {k: v}\n  burst: 1\n  rate: fast\n", []want{{"f.yaml:5:9: rules[0].rate: ", `got the string "fast"`}}},
		{"mode bad", rule("  mode: local\n"), []want{{"f.yaml:6:9: rules[0].mode: ", `"local" is not one of redis, leased`}}},
		{"on_failure bad", rule("  on_failure: open\n"), []want{{"f.yaml:6:15: rules[0].on_failure: ", `"open" is not one of fail_closed, fail_open, emergency`}}},
		{"on_failure bad with emergency block", rule("  on_failure: open\n  emergency: {burst: 1, rate: 1, max_duration: 1s}\n"), []want{
			{"f.yaml:6:15: rules[0].on_failure: ", "is not one of"},
		}},
		{"emergency missing", rule("  on_failure: emergency\n"), []want{{"f.yaml:6:15: rules[0].emergency: ", "required when on_failure is emergency"}}},
		{"emergency without policy", rule("  emergency: {burst: 1, rate: 1, max_duration: 1s}\n"), []want{{"f.yaml:6:3: rules[0].emergency: ", "is set, but on_failure is fail_closed"}}},
		{"emergency empty without policy", rule("  on_failure: fail_open\n  emergency: {}\n"), []want{{"f.yaml:7:3: rules[0].emergency: ", "is set, but on_failure is fail_open"}}},
		{"emergency fields missing", rule("  on_failure: emergency\n  emergency: {rate: 1}\n"), []want{
			{"f.yaml:7:3: rules[0].emergency.burst: ", "required"},
			{"f.yaml:7:3: rules[0].emergency.max_duration: ", "required"},
		}},
		{"emergency values", rule("  on_failure: emergency\n  emergency: {burst: 0, rate: -1, max_duration: 0s}\n"), []want{
			{"f.yaml:7:22: rules[0].emergency.burst: ", "must be in (0, 1e+12], got 0"},
			{"f.yaml:7:31: rules[0].emergency.rate: ", "got -1"},
			{"f.yaml:7:49: rules[0].emergency.max_duration: ", "must be > 0, got 0s"},
		}},
		{"emergency duration without unit", rule("  on_failure: emergency\n  emergency: {burst: 1, rate: 1, max_duration: 30}\n"), []want{
			{"f.yaml:7:48: rules[0].emergency.max_duration: ", "must be a duration with a unit"},
		}},
		{"emergency unknown field", rule("  on_failure: emergency\n  emergency: {burst: 1, rate: 1, max_duration: 1s, for: 2s}\n"), []want{
			{"f.yaml:7:52: rules[0].emergency.for: ", "unknown field; the fields are burst, rate, max_duration"},
		}},
		{"emergency not a mapping", rule("  on_failure: emergency\n  emergency: 5\n"), []want{
			{"f.yaml:7:14: rules[0].emergency: ", "emergency must be a mapping"},
		}},
		{"lease on redis rule", rule("  lease: {period: 5s}\n"), []want{{"f.yaml:6:3: rules[0].lease: ", "is set, but mode is redis"}}},
		{"lease values", rule("  mode: leased\n  lease: {period: -1s, min_slice: -1, max_slice: -2}\n"), []want{
			{"f.yaml:7:19: rules[0].lease.period: ", "must be > 0, got -1s"},
			{"f.yaml:7:35: rules[0].lease.min_slice: ", "got -1"},
			{"f.yaml:7:50: rules[0].lease.max_slice: ", "got -2"},
		}},
		{"lease slices conflict", rule("  mode: leased\n  lease: {min_slice: 0.5, max_slice: 0.2}\n"), []want{
			{"f.yaml:7:38: rules[0].lease.max_slice: ", "0.2 is below min_slice 0.5"},
		}},
		{"lease default share out of range", rule("  mode: leased\n  lease: {default_share: 1.5}\n"), []want{
			{"f.yaml:7:26: rules[0].lease.default_share: ", "must be a fraction in [0, 1] (0 means off), got 1.5"},
		}},
		{"lease default share one subject", rule("  mode: leased\n  lease: {default_share: 0.5}\n"), []want{
			{"f.yaml:7:26: rules[0].lease.default_share: ", "match has no \"*\" key"},
		}},
		{"lease min slice above rate", rule("  mode: leased\n  lease: {min_slice: 2}\n"), []want{
			{"f.yaml:7:22: rules[0].lease.min_slice: ", "2 tokens/s exceeds rate 1 tokens/s"},
		}},
		{"lease max slice above rate", rule("  mode: leased\n  lease: {max_slice: 5}\n"), []want{
			{"f.yaml:7:22: rules[0].lease.max_slice: ", "5 tokens/s exceeds rate 1 tokens/s"},
		}},
		{"lease max subjects negative", rule("  mode: leased\n  lease: {max_subjects: -1}\n"), []want{
			{"f.yaml:7:25: rules[0].lease.max_subjects: ", "must be in [0, 1000000000] (0 means no bound), got -1"},
		}},
		{"lease max subjects too large", rule("  mode: leased\n  lease: {max_subjects: 1000000001}\n"), []want{
			{"f.yaml:7:25: rules[0].lease.max_subjects: ", "got 1000000001"},
		}},
		{"lease max subjects not whole", rule("  mode: leased\n  lease: {max_subjects: 2.5}\n"), []want{
			{"f.yaml:7:25: rules[0].lease.max_subjects: ", "must be a whole number, got"},
		}},
		{"lease max subjects text", rule("  mode: leased\n  lease: {max_subjects: many}\n"), []want{
			{"f.yaml:7:25: rules[0].lease.max_subjects: ", "must be a whole number, got"},
		}},
		{"lease period bad", rule("  mode: leased\n  lease: {period: soon}\n"), []want{
			{"f.yaml:7:19: rules[0].lease.period: ", `must be a duration with a unit, like 30s or 1m30s; got the string "soon"`},
		}},
		{"shadow string", rule("  shadow: \"yes\"\n"), []want{{"f.yaml:6:11: rules[0].shadow: ", `must be true or false, got the string "yes"`}}},
		{"custom tag", rule("  shadow: !flag true\n"), []want{{"f.yaml:6:11: rules[0].shadow: ", `must be true or false, got "true" tagged !flag`}}},
		{"shadow number", rule("  shadow: 1\n"), []want{{"f.yaml:6:11: rules[0].shadow: ", `must be true or false, got "1"`}}},
		{"too many rules", manyRules(MaxRules + 1), []want{{"f.yaml:2:1: rules: ", "has 1001 rules, at most 1000"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse("f.yaml", []byte(tt.src))
			if s != nil {
				t.Errorf("Parse returned a Set with an error")
			}
			ps := problems(t, err)
			if len(ps) != len(tt.want) {
				t.Fatalf("Parse reported %d problems, want %d:\n%v", len(ps), len(tt.want), err)
			}
			for i, w := range tt.want {
				got := ps[i].Error()
				if !strings.HasPrefix(got, w.where) || !strings.Contains(got, w.msg) {
					t.Errorf("problem %d = %q, want prefix %q containing %q", i, got, w.where, w.msg)
				}
			}
		})
	}
}

func manyKeys(n int) string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d: v", i)
	}
	return strings.Join(keys, ", ")
}

func manyRules(n int) string {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := range n {
		fmt.Fprintf(&b, "- {name: r%d, match: {k: v%d}, burst: 1, rate: 1}\n", i, i)
	}
	return b.String()
}

// TestParseReportsEveryProblem checks that one Parse reports the problems of
// several rules together, in file order, and builds nothing.
func TestParseReportsEveryProblem(t *testing.T) {
	src := `rules:
  - name: ok
    match: {tenant: "*"}
    burst: 10
    rate: 1
  - name: Bad
    match: {tenant: "*"}
    burst: -5
    rate: 1
  - name: two
    match: {endpoint: x}
    burst: 10
    rate: 1
    mode: remote
    colour: blue
  - name: ok
    match: {endpoint: y}
    burst: 10
    rate: 1
`
	_, err := Parse("rules.yaml", []byte(src))
	ps := problems(t, err)
	wantPrefixes := []string{
		"rules.yaml:6:11: rules[1].name: ",
		"rules.yaml:8:12: rules[1].burst: ",
		"rules.yaml:14:11: rules[2].mode: ",
		"rules.yaml:15:5: rules[2].colour: ",
		"rules.yaml:16:11: rules[3].name: duplicate rule name \"ok\"; first defined at line 2",
	}
	if len(ps) != len(wantPrefixes) {
		t.Fatalf("got %d problems, want %d:\n%v", len(ps), len(wantPrefixes), err)
	}
	for i, w := range wantPrefixes {
		if got := ps[i].Error(); !strings.HasPrefix(got, w) {
			t.Errorf("problem %d = %q, want prefix %q", i, got, w)
		}
	}
	// The joined message is one problem per line, ready for a terminal.
	if lines := strings.Split(err.Error(), "\n"); len(lines) != len(wantPrefixes) {
		t.Errorf("error has %d lines, want %d", len(lines), len(wantPrefixes))
	}
}

func TestParseCapsProblems(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := range maxProblems + 50 {
		fmt.Fprintf(&b, "- {name: r%d, match: {k: v}, burst: 0, rate: 1}\n", i)
	}
	_, err := Parse("f.yaml", []byte(b.String()))
	ps := problems(t, err)
	if len(ps) != maxProblems+1 {
		t.Fatalf("got %d problems, want %d shown plus a summary", len(ps), maxProblems)
	}
	if got, want := ps[maxProblems].Error(), "f.yaml: 50 more problems not shown"; got != want {
		t.Errorf("summary = %q, want %q", got, want)
	}
}

// TestParseAliasAmplification names one large mapping from every rule: the
// walk must stop at its budget rather than expand it a thousand times.
func TestParseAliasAmplification(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n- &r {")
	for i := range 5000 {
		fmt.Fprintf(&b, "k%d: 1, ", i)
	}
	b.WriteString("name: r}\n")
	for range MaxRules - 1 {
		b.WriteString("- *r\n")
	}
	_, err := Parse("f.yaml", []byte(b.String()))
	ps := problems(t, err)
	// At most the cap, the budget's own problem and the "more" summary.
	if len(ps) > maxProblems+2 || !strings.Contains(err.Error(), "(excessive aliasing)") {
		t.Errorf("got %d problems, want the aliasing budget reported:\n%v", len(ps), err)
	}
}

func TestParseTooLarge(t *testing.T) {
	data := make([]byte, MaxFileSize+1)
	_, err := Parse("big.yaml", data)
	ps := problems(t, err)
	if len(ps) != 1 || !strings.Contains(ps[0].Msg, "larger than") {
		t.Errorf("Parse(too large) = %v", err)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := Load(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrInvalidFile) {
		t.Errorf("Load(missing) = %v, want fs.ErrNotExist and not ErrInvalidFile", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("rules: 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(bad)
	if !errors.Is(err, ErrInvalidFile) || !strings.HasPrefix(err.Error(), bad+":1:8: rules: ") {
		t.Errorf("Load(bad) = %v, want ErrInvalidFile naming %s:1:8", err, bad)
	}
}

func TestRulesReturnsACopy(t *testing.T) {
	s := mustParse(t, "rules:\n- {name: a, match: {k: v}, burst: 1, rate: 1}\n- {name: b, match: {k: v}, burst: 1, rate: 1}\n")
	got := s.Rules()
	got[0], got[1] = got[1], got[0]
	if first := s.Rules()[0].Name; first != "a" {
		t.Errorf("reordering Rules() changed the Set: first rule is %q", first)
	}
}

func TestEnumStrings(t *testing.T) {
	tests := []struct {
		got, want string
	}{
		{ModeRedis.String(), "redis"},
		{ModeLeased.String(), "leased"},
		{Mode(7).String(), "Mode(7)"},
		{Mode(-1).String(), "Mode(-1)"},
		{FailClosed.String(), "fail_closed"},
		{FailOpen.String(), "fail_open"},
		{Emergency.String(), "emergency"},
		{Policy(9).String(), "Policy(9)"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("String() = %q, want %q", tt.got, tt.want)
		}
	}
	var zero Rule
	if zero.OnFailure != FailClosed || zero.Mode != ModeRedis {
		t.Errorf("zero Rule has OnFailure %v, Mode %v; want fail_closed, redis", zero.OnFailure, zero.Mode)
	}
}

// TestValidateRuleInCode covers what only a Rule built in code can get
// wrong, since the parser cannot produce these values.
func TestValidateRuleInCode(t *testing.T) {
	base := func() Rule { return Rule{Name: "r", Match: map[string]string{"k": "v"}, Burst: 1, Rate: 1} }
	tests := []struct {
		name  string
		edit  func(*Rule)
		field string
	}{
		{"valid", func(*Rule) {}, ""},
		{"mode out of range", func(r *Rule) { r.Mode = 5 }, "mode"},
		{"policy out of range", func(r *Rule) { r.OnFailure = -1 }, "on_failure"},
		{"emergency without policy", func(r *Rule) { r.Emergency.Burst = 1 }, "emergency"},
		{"lease without mode", func(r *Rule) { r.Lease.Period = 1 }, "lease"},
		{"leased without period", func(r *Rule) { r.Mode = ModeLeased }, "lease.period"},
		{"max subjects negative", func(r *Rule) { r.Mode, r.Lease.Period, r.Lease.MaxSubjects = ModeLeased, 1, -1 }, "lease.max_subjects"},
		{"invalid utf-8 key", func(r *Rule) { r.Match = map[string]string{"\xff": "v"} }, `match["\xff"]`},
		{"invalid utf-8 value", func(r *Rule) { r.Match = map[string]string{"k": "\xff"} }, "match.k"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := base()
			tt.edit(&r)
			ps := r.validate()
			switch {
			case tt.field == "" && len(ps) != 0:
				t.Errorf("validate() = %v, want none", ps)
			case tt.field != "" && (len(ps) != 1 || ps[0].field != tt.field):
				t.Errorf("validate() = %v, want one problem on %s", ps, tt.field)
			}
		})
	}
}
