package rules

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/ration-dev/ration/internal/bucket"
)

// FuzzParse holds Parse to its contract on any input: no panic; either a nil
// Set and problems that each name the file, or a Set whose every rule is
// valid, unique, findable by name, and matched by its own match block.
// Seeds live in testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	sample, err := os.ReadFile("testdata/sample.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sample)
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("fuzz.yaml", data)
		if err != nil {
			if s != nil {
				t.Fatal("Parse returned both a Set and an error")
			}
			if !errors.Is(err, ErrInvalidFile) {
				t.Fatalf("error %v does not wrap ErrInvalidFile", err)
			}
			for line := range strings.SplitSeq(err.Error(), "\n") {
				if !strings.HasPrefix(line, "fuzz.yaml") {
					t.Fatalf("problem %q does not name the file", line)
				}
			}
			return
		}
		rules := s.Rules()
		if len(rules) > MaxRules {
			t.Fatalf("%d rules accepted, at most %d", len(rules), MaxRules)
		}
		seen := map[string]bool{}
		for _, r := range rules {
			if ps := r.validate(); len(ps) != 0 {
				t.Fatalf("accepted rule %q fails validate: %v", r.Name, ps)
			}
			if seen[r.Name] {
				t.Fatalf("duplicate name %q accepted", r.Name)
			}
			seen[r.Name] = true
			if got, ok := s.Rule(r.Name); !ok || got != r {
				t.Fatalf("Rule(%q) does not find it", r.Name)
			}
			d := map[string]string{}
			for k, v := range r.Match {
				if v == Wildcard {
					v = "any"
				}
				d[k] = v
			}
			if err := ValidateDescriptors(d); err != nil {
				t.Fatalf("rule %q's own match is invalid as descriptors: %v", r.Name, err)
			}
			found := false
			for _, m := range s.Match(d, nil) {
				found = found || m.Rule == r
				if strings.ContainsAny(m.Subject, "{}") {
					t.Fatalf("subject %q contains a hash tag brace", m.Subject)
				}
				if want := bucket.Key(m.Rule.Name, m.Subject); m.Key != want {
					t.Fatalf("rule %s subject %q: Key %q, want bucket.Key's %q", m.Rule.Name, m.Subject, m.Key, want)
				}
			}
			if !found {
				t.Fatalf("rule %q does not match its own match block %v", r.Name, d)
			}
		}
	})
}
