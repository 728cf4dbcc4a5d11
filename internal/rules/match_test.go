package rules

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/ration-dev/ration/internal/bucket"
)

// fataler is what testing.T and rapid.T share.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// setOf builds a Set from rules made in code, holding each to validate.
func setOf(t fataler, rules ...*Rule) *Set {
	t.Helper()
	for _, r := range rules {
		if ps := r.validate(); len(ps) != 0 {
			t.Fatalf("rule %+v: %v", r, ps)
		}
	}
	return newSet(rules, []byte(fmt.Sprint(len(rules))))
}

// got is a Match reduced to names, for comparisons and messages.
type got struct{ rule, subject string }

func names(ms []Match) []got {
	out := []got{}
	for _, m := range ms {
		out = append(out, got{m.Rule.Name, m.Subject})
		if want := bucket.Key(m.Rule.Name, m.Subject); m.Key != want {
			panic(fmt.Sprintf("rule %s subject %q: Key %q, want bucket.Key's %q", m.Rule.Name, m.Subject, m.Key, want))
		}
	}
	return out
}

func TestMatch(t *testing.T) {
	s := mustParse(t, `rules:
- {name: search, match: {endpoint: search}, burst: 1, rate: 1}
- {name: tenant, match: {tenant: "*"}, burst: 1, rate: 1}
- {name: tenant-search, match: {tenant: "*", endpoint: search}, burst: 1, rate: 1}
- {name: acme-search, match: {tenant: acme, endpoint: search}, burst: 1, rate: 1}
- {name: user-tenant, match: {user: "*", tenant: "*"}, burst: 1, rate: 1}
`)
	tests := []struct {
		name string
		d    map[string]string
		want []got
	}{
		{"exact", map[string]string{"endpoint": "search"}, []got{{"search", ""}}},
		{"wildcard", map[string]string{"tenant": "acme"}, []got{{"tenant", "tenant=acme"}}},
		{"several in file order", map[string]string{"tenant": "acme", "endpoint": "search"}, []got{
			{"search", ""}, {"tenant", "tenant=acme"}, {"tenant-search", "tenant=acme"}, {"acme-search", ""},
		}},
		{"exact value differs", map[string]string{"tenant": "other", "endpoint": "search"}, []got{
			{"search", ""}, {"tenant", "tenant=other"}, {"tenant-search", "tenant=other"},
		}},
		{"exact is case-sensitive", map[string]string{"endpoint": "Search"}, []got{}},
		{"missing key", map[string]string{"endpoint": "list"}, []got{}},
		{"wildcard key missing", map[string]string{"user": "u1"}, []got{}},
		{"extra keys ignored", map[string]string{"endpoint": "search", "method": "GET", "ip": "10.0.0.1"}, []got{{"search", ""}}},
		{"subject in key order", map[string]string{"user": "u1", "tenant": "t"}, []got{
			{"tenant", "tenant=t"}, {"user-tenant", "tenant=t,user=u1"},
		}},
		{"empty value is a value", map[string]string{"tenant": ""}, []got{{"tenant", "tenant="}}},
		{"separators escaped", map[string]string{"tenant": "a,b=c"}, []got{{"tenant", "tenant=a%2Cb%3Dc"}}},
		{"hash tag escaped", map[string]string{"tenant": "{x}"}, []got{{"tenant", "tenant=%7Bx%7D"}}},
		{"escape escaped", map[string]string{"tenant": "%2C"}, []got{{"tenant", "tenant=%252C"}}},
		{"control escaped", map[string]string{"tenant": "a\nb\x7f"}, []got{{"tenant", "tenant=a%0Ab%7F"}}},
		{"unicode kept", map[string]string{"tenant": "zürich\\"}, []got{{"tenant", "tenant=zürich\\"}}},
		{"nil descriptors", nil, []got{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if g := names(s.Match(tt.d, nil)); !reflect.DeepEqual(g, tt.want) {
				t.Errorf("Match(%v) = %v, want %v", tt.d, g, tt.want)
			}
		})
	}
}

func TestMatchAppends(t *testing.T) {
	s := mustParse(t, "rules:\n- {name: a, match: {k: '*'}, burst: 1, rate: 1}\n")
	sentinel := Match{Subject: "kept"}
	out := s.Match(map[string]string{"k": "v"}, []Match{sentinel})
	if len(out) != 2 || out[0] != sentinel || out[1].Rule.Name != "a" {
		t.Errorf("Match appended to [kept] = %v, want [kept a]", names(out))
	}
}

func TestMatchKeyEscaped(t *testing.T) {
	// Keys are escaped like values: a key can hold any character.
	s := setOf(t, &Rule{Name: "r", Match: map[string]string{"a=b": "*", "{c}": "*"}, Burst: 1, Rate: 1})
	g := names(s.Match(map[string]string{"a=b": "1", "{c}": "2"}, nil))
	if want := []got{{"r", "a%3Db=1,%7Bc%7D=2"}}; !reflect.DeepEqual(g, want) {
		t.Errorf("Match = %v, want %v", g, want)
	}
}

// refEscape and refMatch are a slow, obviously correct model of Match.
func refEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f || strings.IndexByte("%,={}", c) >= 0 {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

func refMatch(rules []*Rule, d map[string]string) []got {
	out := []got{}
	for _, r := range rules {
		var parts []string
		ok := true
		for _, k := range slices.Sorted(maps.Keys(r.Match)) {
			v, present := d[k]
			switch {
			case !present || r.Match[k] != Wildcard && v != r.Match[k]:
				ok = false
			case r.Match[k] == Wildcard:
				parts = append(parts, refEscape(k)+"="+refEscape(v))
			}
		}
		if ok {
			out = append(out, got{r.Name, strings.Join(parts, ",")})
		}
	}
	return out
}

// decodeSubject inverts the subject encoding. That a left inverse exists is
// what makes subjects collision-free: different values, different subjects.
func decodeSubject(s string) ([][2]string, error) {
	var kvs [][2]string
	if s == "" {
		return nil, nil
	}
	for part := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok || strings.Contains(v, "=") {
			return nil, fmt.Errorf("part %q is not one k=v", part)
		}
		var err error
		var kv [2]string
		for i, x := range []string{k, v} {
			if kv[i], err = unescape(x); err != nil {
				return nil, err
			}
		}
		kvs = append(kvs, kv)
	}
	return kvs, nil
}

func unescape(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("truncated escape in %q", s)
		}
		n, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", err
		}
		b.WriteByte(byte(n))
		i += 2
	}
	return b.String(), nil
}

// tricky draws strings rich in the characters escaping must handle,
// including the digits and letters of escapes themselves.
func tricky() *rapid.Generator[string] {
	return rapid.StringOfN(rapid.SampledFrom([]rune{'a', '2', 'C', '7', 'B', ',', '=', '%', '\\', '{', '}', '|', '\n', 'ü'}), 0, 8, -1)
}

func TestMatchSubjectInjective(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		keys := rapid.SliceOfNDistinct(tricky().Filter(func(s string) bool { return s != "" }), 1, 4, rapid.ID).Draw(t, "keys")
		match := map[string]string{}
		var wild []string
		for i, k := range keys {
			if i == 0 || rapid.Bool().Draw(t, "wild") {
				match[k] = Wildcard
				wild = append(wild, k)
			} else {
				match[k] = "x"
			}
		}
		slices.Sort(wild)
		s := setOf(t, &Rule{Name: "r", Match: match, Burst: 1, Rate: 1})
		draw := func(label string) map[string]string {
			d := map[string]string{}
			for k, v := range match {
				if v == Wildcard {
					v = tricky().Draw(t, label)
				}
				d[k] = v
			}
			return d
		}
		d1, d2 := draw("d1"), draw("d2")
		m1, m2 := s.Match(d1, nil), s.Match(d2, nil)
		if len(m1) != 1 || len(m2) != 1 {
			t.Fatalf("Match = %v, %v; want one match each", names(m1), names(m2))
		}
		for _, sub := range []string{m1[0].Subject, m2[0].Subject} {
			if strings.ContainsAny(sub, "{}") {
				t.Fatalf("subject %q contains a hash tag brace", sub)
			}
		}
		sameValues := true
		for _, k := range wild {
			sameValues = sameValues && d1[k] == d2[k]
		}
		if same := m1[0].Subject == m2[0].Subject; same != sameValues {
			t.Fatalf("subjects %q, %q equal=%v, but wildcard values equal=%v (%v vs %v)",
				m1[0].Subject, m2[0].Subject, same, sameValues, d1, d2)
		}
		kvs, err := decodeSubject(m1[0].Subject)
		if err != nil {
			t.Fatalf("decode %q: %v", m1[0].Subject, err)
		}
		var want [][2]string
		for _, k := range wild {
			want = append(want, [2]string{k, d1[k]})
		}
		if !reflect.DeepEqual(kvs, want) {
			t.Fatalf("decode(%q) = %q, want %q", m1[0].Subject, kvs, want)
		}
	})
}

// TestMatchAgreesWithModel checks the index and bitset against a linear
// scan, with enough rules to need several bitset words.
func TestMatchAgreesWithModel(t *testing.T) {
	keys := []string{"a", "b", "c", "d"}
	values := []string{"x", "y", Wildcard}
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 200).Draw(t, "rules")
		rules := make([]*Rule, n)
		for i := range rules {
			ks := rapid.SliceOfNDistinct(rapid.SampledFrom(keys), 1, 3, rapid.ID).Draw(t, "keys")
			m := map[string]string{}
			for _, k := range ks {
				m[k] = rapid.SampledFrom(values).Draw(t, "value")
			}
			rules[i] = &Rule{Name: "r" + strconv.Itoa(i), Match: m, Burst: 1, Rate: 1}
		}
		s := setOf(t, rules...)
		for range 5 {
			d := rapid.MapOfN(rapid.SampledFrom(append(keys, "e")), rapid.SampledFrom([]string{"x", "y", "z", ""}), 0, 5).Draw(t, "d")
			if g, w := names(s.Match(d, nil)), refMatch(rules, d); !reflect.DeepEqual(g, w) {
				t.Fatalf("Match(%v) = %v, want %v", d, g, w)
			}
		}
	})
}

// TestMatchAllocations pins the hot path's allocation budget: nothing for a
// rule without wildcards, one string per matched wildcard rule.
func TestMatchAllocations(t *testing.T) {
	s := mustParse(t, `rules:
- {name: search, match: {endpoint: search}, burst: 1, rate: 1}
- {name: tenant, match: {tenant: "*", endpoint: search}, burst: 1, rate: 1}
- {name: other, match: {endpoint: list}, burst: 1, rate: 1}
`)
	tests := []struct {
		name string
		d    map[string]string
		want float64
	}{
		{"exact only", map[string]string{"endpoint": "search"}, 0},
		{"no match", map[string]string{"endpoint": "none", "tenant": "t"}, 0},
		{"one wildcard rule", map[string]string{"endpoint": "search", "tenant": "t"}, 1},
		{"wildcard with escapes", map[string]string{"endpoint": "search", "tenant": "{a,b}"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := make([]Match, 0, 8)
			if n := testing.AllocsPerRun(100, func() { out = s.Match(tt.d, out[:0]) }); n != tt.want {
				t.Errorf("Match(%v) allocates %v times, want %v", tt.d, n, tt.want)
			}
		})
	}
}

func TestValidateDescriptors(t *testing.T) {
	many := func(n int) map[string]string {
		d := map[string]string{}
		for i := range n {
			d["k"+strconv.Itoa(i)] = "v"
		}
		return d
	}
	long := strings.Repeat("x", MaxKeyLen)
	tests := []struct {
		name string
		d    map[string]string
		want string // "" for valid, else a fragment of the error
	}{
		{"one", map[string]string{"tenant": "acme"}, ""},
		{"empty value", map[string]string{"tenant": ""}, ""},
		{"at limits", map[string]string{long: long}, ""},
		{"64 entries", many(MaxDescriptors), ""},
		{"nil", nil, "no descriptors"},
		{"empty", map[string]string{}, "no descriptors"},
		{"65 entries", many(MaxDescriptors + 1), "65 descriptors, at most 64"},
		{"empty key", map[string]string{"": "v"}, `key "": key is empty`},
		{"long key", map[string]string{long + "y": "v"}, "key is 257 bytes, at most 256"},
		{"long value", map[string]string{"k": long + "y"}, `key "k": value is 257 bytes, at most 256`},
		{"bad utf-8 key", map[string]string{"k\xff": "v"}, `key "k\xff": key is not valid UTF-8`},
		{"bad utf-8 value", map[string]string{"k": "\xc3"}, `key "k": value is not valid UTF-8`},
		{"first bad key in order", map[string]string{"b": "\xff", "a": "\xff", "c": "ok"}, `key "a": value`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 10 { // map order varies; the answer must not
				err := ValidateDescriptors(tt.d)
				switch {
				case tt.want == "" && err != nil:
					t.Fatalf("ValidateDescriptors = %v, want nil", err)
				case tt.want != "" && (!errors.Is(err, ErrInvalidDescriptors) || !strings.Contains(err.Error(), tt.want)):
					t.Fatalf("ValidateDescriptors = %v, want ErrInvalidDescriptors containing %q", err, tt.want)
				}
			}
		})
	}
}
