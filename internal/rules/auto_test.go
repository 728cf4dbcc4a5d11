package rules

import (
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/region"
)

func TestParseAuto(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want Auto
		// inRegion: thresholds seen by an agent of region "eu".
		euPromote, euDemote float64
	}{
		{"defaults", "  mode: auto\n",
			Auto{PromoteAbove: DefaultPromoteAbove, DemoteBelow: DefaultPromoteAbove / 4, Hold: DefaultHold}, DefaultPromoteAbove, DefaultPromoteAbove / 4},
		{"promote only: demote follows", "  mode: auto\n  auto: {promote_above: 400}\n",
			Auto{PromoteAbove: 400, DemoteBelow: 100, Hold: DefaultHold}, 400, 100},
		{"everything", "  mode: auto\n  auto: {promote_above: 400/s, demote_below: 50, hold: 5s}\n  lease: {period: 4s}\n",
			Auto{PromoteAbove: 400, DemoteBelow: 50, Hold: 5 * time.Second}, 400, 50},
		{"a region's override, before the rule's own", "  mode: auto\n  auto:\n    regions: {eu: {promote_above: 8000}, us: {promote_above: 10, demote_below: 1}}\n    promote_above: 400\n",
			Auto{PromoteAbove: 400, DemoteBelow: 100, Hold: DefaultHold, Regions: map[region.ID]AutoThresholds{
				"eu": {PromoteAbove: 8000, DemoteBelow: 2000}, "us": {PromoteAbove: 10, DemoteBelow: 1}}}, 8000, 2000},
		{"a region with no override of promote_above", "  mode: auto\n  auto: {promote_above: 400, regions: {eu: {demote_below: 7}}}\n",
			Auto{PromoteAbove: 400, DemoteBelow: 100, Hold: DefaultHold, Regions: map[region.ID]AutoThresholds{
				"eu": {PromoteAbove: 400, DemoteBelow: 7}}}, 400, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustParse(t, "rules:\n- name: r\n  match: {tenant: '*'}\n  burst: 100\n  rate: 50\n"+tt.src)
			r, _ := s.Rule("r")
			if r.Mode != ModeAuto || !r.Mode.Leases() {
				t.Fatalf("mode %v", r.Mode)
			}
			if r.Auto.String() != tt.want.String() || len(r.Auto.Regions) != len(tt.want.Regions) {
				t.Fatalf("auto = %+v, want %+v", r.Auto, tt.want)
			}
			for id, w := range tt.want.Regions {
				if r.Auto.Regions[id] != w {
					t.Errorf("region %s = %+v, want %+v", id, r.Auto.Regions[id], w)
				}
			}
			if p, d := r.Auto.Thresholds("eu"); p != tt.euPromote || d != tt.euDemote {
				t.Errorf("Thresholds(eu) = %v, %v; want %v, %v", p, d, tt.euPromote, tt.euDemote)
			}
			if r.Lease.Period <= 0 {
				t.Errorf("lease period %v: a mode auto rule's promoted subjects need one", r.Lease.Period)
			}
		})
	}
}

func TestParseAutoInvalid(t *testing.T) {
	const head = "rules:\n- name: r\n  match: {tenant: '*'}\n  burst: 100\n"
	tests := []struct {
		name string
		src  string
		want []want
	}{
		{"auto without mode auto", head + "  rate: 5\n  auto: {promote_above: 10}\n", []want{
			{"f.yaml:6:3: rules[0].auto: ", "is set, but mode is redis: it would never be used; remove it or set mode: auto"}}},
		{"rate 0", head + "  rate: 0\n  mode: auto\n", []want{
			{"f.yaml:5:9: rules[0].rate: ", "must be > 0 with mode auto"}}},
		{"demote above promote", head + "  rate: 5\n  mode: auto\n  auto: {promote_above: 10, demote_below: 20}\n", []want{
			{"f.yaml:7:43: rules[0].auto.demote_below: ", "must be in [0, promote_above 10] decisions/s, got 20"}}},
		{"promote 0", head + "  rate: 5\n  mode: auto\n  auto: {promote_above: 0}\n", []want{
			{"f.yaml:7:25: rules[0].auto.promote_above: ", "must be in (0, 1e+12] decisions/s, got 0"}}},
		{"hold too short", head + "  rate: 5\n  mode: auto\n  auto: {hold: 10ms}\n", []want{
			{"f.yaml:7:16: rules[0].auto.hold: ", "must be in [200ms, 1m0s], got 10ms"}}},
		{"hold not a duration", head + "  rate: 5\n  mode: auto\n  auto: {hold: 2}\n", []want{
			{"f.yaml:7:16: rules[0].auto.hold: ", "must be a duration with a unit"}}},
		{"unknown field", head + "  rate: 5\n  mode: auto\n  auto: {promote: 2}\n", []want{
			{"f.yaml:7:10: rules[0].auto.promote: ", "unknown field; the fields are promote_above, demote_below, hold, regions"}}},
		{"region demote above its promote", head + "  rate: 5\n  mode: auto\n  auto: {regions: {eu: {promote_above: 5, demote_below: 6}}}\n", []want{
			{"rules[0].auto.regions.eu.demote_below: ", "must be in [0, promote_above 5] decisions/s, got 6"}}},
		{"global scope", head + "  rate: 5\n  mode: auto\n  scope: global\n  regions: {eu: {weight: 1}}\n", []want{
			{"rules[0].scope: ", "global is not supported with mode auto"}}},
		{"default share", head + "  rate: 5\n  mode: auto\n  lease: {default_share: 0.5}\n", []want{
			{"rules[0].lease.default_share: ", "is not supported with mode auto"}}},
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
				if got := ps[i].Error(); !strings.Contains(got, w.where) || !strings.Contains(got, w.msg) {
					t.Errorf("problem %d = %q, want %q containing %q", i, got, w.where, w.msg)
				}
			}
		})
	}
}
