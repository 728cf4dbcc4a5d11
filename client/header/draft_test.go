package header

import (
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The examples of draft-ietf-httpapi-ratelimit-headers-11, each with the
// items it means. Every one must parse to those items; canonical ones (the
// draft's own spacing matches RFC 9651 serialization) must also come out of
// the formatter byte for byte, and every one must survive a round trip.
var draftPolicyExamples = []struct {
	section, value string
	want           []PolicyItem
	canonical      bool
}{
	{"3", `"burst";q=100;w=60,"daily";q=1000;w=86400`,
		[]PolicyItem{{Name: "burst", Quota: 100, Window: 60}, {Name: "daily", Quota: 1000, Window: 86400}}, false},
	{"3.2", `"default";q=100;w=10`, []PolicyItem{{Name: "default", Quota: 100, Window: 10}}, true},
	{"3.2", `"permin";q=50;w=60,"perhr";q=1000;w=3600`,
		[]PolicyItem{{Name: "permin", Quota: 50, Window: 60}, {Name: "perhr", Quota: 1000, Window: 3600}}, false},
	// The draft's partition keys carry non-zero pad bits; RFC 9651 asks
	// parsers to accept them, so re-encoding differs from the text.
	{"3.2", `"peruser";q=100;w=60;pk=:cHsdsRa894==:`,
		[]PolicyItem{{Name: "peruser", Quota: 100, Window: 60, PartitionKey: mustB64("cHsdsRa894==")}}, false},
	{"3.2", `"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:`,
		[]PolicyItem{{Name: "peruser", Quota: 65535, Unit: "content-bytes", Window: 10, PartitionKey: mustB64("sdfjLJUOUH==")}}, false},
	{"8.5", `"somepolicy";q=10000;w=1000`, []PolicyItem{{Name: "somepolicy", Quota: 10000, Window: 1000}}, true},
	{"B.1.3", `"basic";q=100;w=60`, []PolicyItem{{Name: "basic", Quota: 100, Window: 60}}, true},
	{"B.2.1", `"fixedwindow";q=100;w=60`, []PolicyItem{{Name: "fixedwindow", Quota: 100, Window: 60}}, true},
	{"B.2.3", `"dynamic";q=15;w=20`, []PolicyItem{{Name: "dynamic", Quota: 15, Window: 20}}, true},
	{"B.3.1", `"hour";q=1000;w=3600, "day";q=5000;w=86400`,
		[]PolicyItem{{Name: "hour", Quota: 1000, Window: 3600}, {Name: "day", Quota: 5000, Window: 86400}}, true},
	// FAQ: other parameters are comments.
	{"FAQ", `"sliding";q=100;w=60;burst=1000`, []PolicyItem{{Name: "sliding", Quota: 100, Window: 60}}, false},
	{"FAQ", `"fixed";q=5000;w=3600;burst=0`, []PolicyItem{{Name: "fixed", Quota: 5000, Window: 3600}}, false},
	{"web", `"sliding";q=12;w=1`, []PolicyItem{{Name: "sliding", Quota: 12, Window: 1}}, true},
}

var draftLimitExamples = []struct {
	section, value string
	want           []LimitItem
	canonical      bool
}{
	{"4", `"default";r=50;t=30`, []LimitItem{{Name: "default", Remaining: 50, Reset: 30}}, true},
	{"4.2", `"default";r=999;pk=:dHJpYWwxMjEzMjM=:`, []LimitItem{{Name: "default", Remaining: 999, Reset: -1, PartitionKey: []byte("trial121323")}}, true},
	{"4.2", `"default";r=300000000;t=60;pk=:QXBwLTk5OQ==:`, []LimitItem{{Name: "default", Remaining: 300000000, Reset: 60, PartitionKey: []byte("App-999")}}, true},
	{"6", `"problemPolicy";r=0;t=10`, []LimitItem{{Name: "problemPolicy", Remaining: 0, Reset: 10}}, true},
	{"7", `"default";r=1;t=7`, []LimitItem{{Name: "default", Remaining: 1, Reset: 7}}, true},
	{"8.5", `"daily";r=1;t=86400`, []LimitItem{{Name: "daily", Remaining: 1, Reset: 86400}}, true},
	{"8.5", `"somepolicy";r=10000;t=10`, []LimitItem{{Name: "somepolicy", Remaining: 10000, Reset: 10}}, true},
	{"B.1.1", `"default";r=0;t=50`, []LimitItem{{Name: "default", Remaining: 0, Reset: 50}}, true},
	{"B.1.2", `"dayLimit";r=100;t=36000`, []LimitItem{{Name: "dayLimit", Remaining: 100, Reset: 36000}}, true},
	{"B.1.3", `"basic";r=20;t=56`, []LimitItem{{Name: "basic", Remaining: 20, Reset: 56}}, true},
	{"B.1.4", `"default";r=0;t=5`, []LimitItem{{Name: "default", Remaining: 0, Reset: 5}}, true},
	{"B.2.1", `"fixedwindow";r=99;t=50`, []LimitItem{{Name: "fixedwindow", Remaining: 99, Reset: 50}}, true},
	{"B.2.2", `"dynamic";r=9;t=50`, []LimitItem{{Name: "dynamic", Remaining: 9, Reset: 50}}, true},
	{"B.3", `"dynamic";r=15;t=40`, []LimitItem{{Name: "dynamic", Remaining: 15, Reset: 40}}, true},
	{"FAQ", `"sliding";r=50;t=44`, []LimitItem{{Name: "sliding", Remaining: 50, Reset: 44}}, true},
	// q is not a RateLimit parameter: a comment.
	{"web", `"sliding";q=12;r=6;t=1`, []LimitItem{{Name: "sliding", Remaining: 6, Reset: 1}}, false},
}

func mustB64(s string) []byte {
	v, err := (&sfParser{s: ":" + s + ":"}).bytes()
	if err != nil {
		panic(err)
	}
	return v.([]byte)
}

func TestDraftPolicyExamples(t *testing.T) {
	for _, ex := range draftPolicyExamples {
		got, err := ParsePolicy(ex.value)
		if err != nil {
			t.Errorf("section %s: ParsePolicy(%s) = %v", ex.section, ex.value, err)
			continue
		}
		if !reflect.DeepEqual(got, ex.want) {
			t.Errorf("section %s: ParsePolicy(%s) = %+v, want %+v", ex.section, ex.value, got, ex.want)
		}
		out := FormatPolicy(got...)
		if ex.canonical && out != ex.value {
			t.Errorf("section %s: FormatPolicy = %s, want the draft's %s", ex.section, out, ex.value)
		}
		if again, err := ParsePolicy(out); err != nil || !reflect.DeepEqual(again, got) {
			t.Errorf("section %s: round trip of %s = %+v, %v; want %+v", ex.section, out, again, err, got)
		}
	}
}

func TestDraftLimitExamples(t *testing.T) {
	for _, ex := range draftLimitExamples {
		got, err := ParseRateLimit(ex.value)
		if err != nil {
			t.Errorf("section %s: ParseRateLimit(%s) = %v", ex.section, ex.value, err)
			continue
		}
		if !reflect.DeepEqual(got, ex.want) {
			t.Errorf("section %s: ParseRateLimit(%s) = %+v, want %+v", ex.section, ex.value, got, ex.want)
		}
		out := FormatRateLimit(got...)
		if ex.canonical && out != ex.value {
			t.Errorf("section %s: FormatRateLimit = %s, want the draft's %s", ex.section, out, ex.value)
		}
		if again, err := ParseRateLimit(out); err != nil || !reflect.DeepEqual(again, got) {
			t.Errorf("section %s: round trip of %s = %+v, %v; want %+v", ex.section, out, again, err, got)
		}
	}
}

// The draft's throttled responses, produced from Ration quotas: what each
// surface writes for a token bucket in the same state.
func TestDraftResponsesFromQuotas(t *testing.T) {
	tests := []struct {
		section string
		q       Quota
		want    http.Header
	}{
		{
			// B.3: 429 with Retry-After: 20, 15 of 100 per minute left, full in 40 s.
			section: "B.3",
			q:       Quota{Policy: "dynamic", Limit: 100, Rate: 100.0 / 60, Remaining: 15, Reset: 40 * time.Second, RetryAfter: 20 * time.Second},
			want: http.Header{
				"Retry-After":      {"20"},
				"Ratelimit-Policy": {`"dynamic";q=100;w=60`},
				"Ratelimit":        {`"dynamic";r=15;t=40`},
			},
		},
		{
			// B.2.1: 99 of 100 per minute left; reset rounds up from 49.2 s.
			section: "B.2.1",
			q:       Quota{Policy: "fixedwindow", Limit: 100, Rate: 100.0 / 60, Remaining: 99.4, Reset: 49200 * time.Millisecond},
			want: http.Header{
				"Ratelimit-Policy": {`"fixedwindow";q=100;w=60`},
				"Ratelimit":        {`"fixedwindow";r=99;t=50`},
			},
		},
	}
	for _, tt := range tests {
		h := http.Header{}
		Set(h, tt.q)
		if !reflect.DeepEqual(h, tt.want) {
			t.Errorf("section %s: Set(%+v) = %v, want %v", tt.section, tt.q, h, tt.want)
		}
	}
}

// B.3.1: two policies on one response, as Fields lists them.
func TestFieldsMultiplePolicies(t *testing.T) {
	hour := Quota{Policy: "hour", Limit: 1000, Rate: 1000.0 / 3600, Remaining: 900, Reset: 360 * time.Second}
	day := Quota{Policy: "day", Limit: 5000, Rate: 5000.0 / 86400, Remaining: 100, Reset: 36000 * time.Second}
	got := Fields(0, hour, day)
	want := []Field{
		{NamePolicy, `"hour";q=1000;w=3600, "day";q=5000;w=86400`},
		{NameRateLimit, `"hour";r=900;t=360, "day";r=100;t=36000`},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Fields = %v, want %v", got, want)
	}
	got = Fields(1500*time.Millisecond, day)
	if last := got[len(got)-1]; last != (Field{NameRetryAfter, "2"}) {
		t.Fatalf("Fields with a wait ends with %v, want Retry-After: 2 (rounded up)", last)
	}
	if got := Fields(0); len(got) != 0 {
		t.Fatalf("Fields() = %v, want nothing", got)
	}
}

func TestUnavailable(t *testing.T) {
	h := http.Header{}
	Set(h, Quota{Policy: "p", Limit: 5, Rate: 1, RetryAfter: 3 * time.Second})
	Unavailable(h)
	want := http.Header{"Retry-After": {"1"}}
	if !reflect.DeepEqual(h, want) {
		t.Fatalf("after Unavailable: %v, want %v", h, want)
	}
}

func TestParseRejects(t *testing.T) {
	policy := []struct{ in, want string }{
		{``, "empty"},
		{`"a";w=10`, "q is required"},
		{`"a";q=-1`, "non-negative"},
		{`"a";q=1.5`, "non-negative integer"},
		{`"a";q=1;w=0`, "positive"},
		{`"a";q=1;qu=requests`, "qu must be a string"},
		{`"a";q=1;pk="x"`, "byte sequence"},
		{`a;q=1`, "quoted string"},
		{`("a");q=1`, "inner lists"},
		{`"a";q=1,`, "trailing comma"},
		{`"a";q=1 "b";q=2`, "expected ','"},
		{`"a;q=1`, "unterminated"},
		{`"a";q=1234567890123456`, "15 digits"},
		{`"a";Q=1`, "lowercase"},
		{`"a";q=1;pk=:!!:`, "byte sequence"},
	}
	for _, tt := range policy {
		_, err := ParsePolicy(tt.in)
		if !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParsePolicy(%s) = %v, want ErrSyntax mentioning %q", tt.in, err, tt.want)
		}
	}
	limit := []struct{ in, want string }{
		{`"a";t=1`, "r is required"},
		{`"a";r=1;t=-1`, "non-negative"},
		{`"a";r=?1`, "non-negative integer"},
	}
	for _, tt := range limit {
		_, err := ParseRateLimit(tt.in)
		if !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseRateLimit(%s) = %v, want ErrSyntax mentioning %q", tt.in, err, tt.want)
		}
	}
}

// Whatever a policy is named, the fields stay parseable: names are escaped
// or replaced, never able to break the list.
func TestFormatAnyNameParses(t *testing.T) {
	for _, name := range []string{`a"b`, `back\slash`, "tab\there", "naïve", ",;=", ""} {
		q := Quota{Policy: name, Limit: 3, Rate: 1, Remaining: 1, Reset: time.Second}
		if _, err := ParsePolicy(PolicyValue(q)); err != nil {
			t.Errorf("ParsePolicy(PolicyValue(%q)) = %v", name, err)
		}
		if _, err := ParseRateLimit(Value(q)); err != nil {
			t.Errorf("ParseRateLimit(Value(%q)) = %v", name, err)
		}
	}
}
