package rules

import (
	"strings"
	"testing"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/region"
)

func TestParseScopes(t *testing.T) {
	s := mustParse(t, `rules:
  - name: local
    match: {tenant: "*"}
    burst: 10
    rate: 1
  - name: split
    match: {tenant: "*"}
    burst: 300
    rate: 30/s
    scope: global
    regions: {eu: {weight: 2}, us: {weight: 1}, ap: }
  - name: leased
    match: {api: "*"}
    burst: 100
    rate: 20
    mode: leased
    scope: global
    regions:
      eu: {weight: 2, safe_share: 10}
      us: {weight: 1, safe_share: 5}
`)
	local, _ := s.Rule("local")
	if local.Scope != region.ScopeRegion || local.Regions != nil {
		t.Errorf("local: scope %v regions %v, want region, none", local.Scope, local.Regions)
	}
	if l, ok := local.Limit("anywhere"); !ok || l != (bucket.Limit{Burst: 10, Rate: 1}) {
		t.Errorf("local.Limit(anywhere) = %v, %v, want the whole rule", l, ok)
	}
	split, _ := s.Rule("split")
	for id, want := range map[region.ID]bucket.Limit{"eu": {Burst: 150, Rate: 15}, "us": {Burst: 75, Rate: 7.5}, "ap": {Burst: 75, Rate: 7.5}} {
		if got, ok := split.Limit(id); !ok || got != want {
			t.Errorf("split.Limit(%s) = %v, %v, want %v", id, got, ok, want)
		}
	}
	if _, ok := split.Limit("sa"); ok {
		t.Error("split.Limit(sa) ok, want no share for a region the rule does not name")
	}
	leased, _ := s.Rule("leased")
	want := map[region.ID]region.Weight{"eu": {Weight: 2, SafeShare: 10}, "us": {Weight: 1, SafeShare: 5}}
	if len(leased.Regions) != 2 || leased.Regions["eu"] != want["eu"] || leased.Regions["us"] != want["us"] {
		t.Errorf("leased.Regions = %v, want %v", leased.Regions, want)
	}
	if l, ok := leased.Limit("eu"); !ok || l.Burst != 100 {
		t.Errorf("leased.Limit(eu) = %v, want the whole rule (its agents hold leases)", l)
	}
	if err := s.CheckRegion("eu"); err != nil {
		t.Errorf("CheckRegion(eu) = %v, want nil: every global rule names eu", err)
	}
	if err := s.CheckRegion("sa"); err == nil || !strings.Contains(err.Error(), `"sa"`) {
		t.Errorf("CheckRegion(sa) = %v, want an error naming the region", err)
	}
}

func TestParseScopeInvalid(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      []string // "line:col field: message fragment"
	}{
		{"global without regions", `rules:
  - name: a
    match: {k: "*"}
    burst: 1
    rate: 1
    scope: global
`, []string{"2:5 rules[0].regions: required when scope is global"}},
		{"regions on a regional rule", `rules:
  - name: a
    match: {k: "*"}
    burst: 1
    rate: 1
    regions: {eu: {weight: 1}}
`, []string{"6:5 rules[0].regions: is set, but scope is region"}},
		{"bad scope, bad region, bad weight, unknown field, safe share on redis", `rules:
  - name: a
    match: {k: "*"}
    burst: 1
    rate: 1
    scope: planet
  - name: b
    match: {k: "*"}
    burst: 1
    rate: 1
    scope: global
    regions:
      EU: {weight: 1}
      us: {weight: 0, safe_share: 1, colour: red}
`, []string{
			`6:12 rules[0].scope: "planet" is not one of region, global`,
			`13:7 rules[1].regions["EU"]: region name "EU" must match`,
			`14:20 rules[1].regions.us.weight: must be in [1e-06, 1e+06], got 0`,
			`14:35 rules[1].regions.us.safe_share: is set, but mode is redis`,
			`14:38 rules[1].regions.us.colour: unknown field`,
		}},
		{"safe shares above rate", `rules:
  - name: a
    match: {k: "*"}
    burst: 10
    rate: 10
    mode: leased
    scope: global
    regions: {eu: {safe_share: 6}, us: {safe_share: 6}}
`, []string{"8:5 rules[0].regions: safe shares sum to 12, above rate 10: regions cut off from the global group could admit 2 tokens/s too many"}},
		{"safe share above rate, and overshoot on redis", `rules:
  - name: a
    match: {k: "*"}
    burst: 10
    rate: 10
    mode: leased
    scope: global
    regions: {eu: {safe_share: 11}}
  - name: b
    match: {k: "*"}
    burst: 10
    rate: 10
    scope: global
    regions: {eu: }
    allow_overshoot: true
`, []string{
			"8:32 rules[0].regions.eu.safe_share: 11 exceeds rate 10",
			"15:22 rules[1].allow_overshoot: is set, but mode is redis",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("test.yaml", []byte(tc.src))
			ps := problems(t, err)
			var got []string
			for _, p := range ps {
				got = append(got, strings.TrimPrefix(p.Error(), "test.yaml:"))
			}
			if len(got) != len(tc.want) {
				t.Fatalf("Parse = %d problems:\n%s\nwant %d:\n%s", len(got), strings.Join(got, "\n"), len(tc.want), strings.Join(tc.want, "\n"))
			}
			for i, w := range tc.want {
				loc, rest, _ := strings.Cut(w, " ")
				if !strings.HasPrefix(got[i], loc+": "+rest) {
					t.Errorf("problem %d = %q, want %q", i, got[i], w)
				}
			}
		})
	}
}

func TestParseAllowOvershoot(t *testing.T) {
	s := mustParse(t, `rules:
  - name: a
    match: {k: "*"}
    burst: 10
    rate: 10
    mode: leased
    scope: global
    allow_overshoot: true
    regions: {eu: {safe_share: 6}, us: {safe_share: 6}}
`)
	r, _ := s.Rule("a")
	if got := region.Overshoot(r.Burst, r.Rate, r.Regions); got.Rate != 2 {
		t.Fatalf("Overshoot = %v, want rate 2", got)
	}
}
