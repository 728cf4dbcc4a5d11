package examples

import (
	"os"
	"testing"

	"github.com/ration-dev/ration/internal/rules"
)

// The example file parses with the rules parser both binaries use and
// shows both modes; Rules is the file.
func TestRules(t *testing.T) {
	b, err := os.ReadFile("rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != string(Rules()) {
		t.Fatal("Rules() is not rules.yaml")
	}
	set, err := rules.Load("rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	modes := map[rules.Mode]int{}
	for _, r := range set.Rules() {
		modes[r.Mode]++
	}
	if modes[rules.ModeRedis] == 0 || modes[rules.ModeLeased] == 0 {
		t.Fatalf("rules by mode %v: want redis and leased rules", modes)
	}
	// The README's leased rule.
	if r, ok := set.Rule("hot-endpoint"); !ok || r.Mode != rules.ModeLeased {
		t.Fatalf("hot-endpoint = %+v, want a leased rule", r)
	}
}

// leased.yaml, the rules of an agent without Redis (docs/configuration.md),
// holds leased rules only, each one a rule of rules.yaml.
func TestLeasedRules(t *testing.T) {
	leased, err := rules.Load("leased.yaml")
	if err != nil {
		t.Fatal(err)
	}
	all, err := rules.Load("rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(leased.Rules()) == 0 {
		t.Fatal("leased.yaml holds no rules")
	}
	for _, r := range leased.Rules() {
		if r.Mode != rules.ModeLeased {
			t.Errorf("%s: mode %v, want leased: an agent without Redis refuses any other", r.Name, r.Mode)
		}
		if o, ok := all.Rule(r.Name); !ok || o.Mode != r.Mode || o.Burst != r.Burst || o.Rate != r.Rate {
			t.Errorf("%s is not rules.yaml's rule of that name (%+v)", r.Name, o)
		}
	}
}
