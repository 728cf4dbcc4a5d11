package coordinator_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// tuneRegionRules: hierRules' global rule (shares for eu and us), and a
// rule of the group's own (scope: region, the default).
const tuneRegionRules = hierRules + `  - name: l
    match: {l: "*"}
    burst: 40
    rate: 60
    mode: leased
    lease: {period: 1s}
`

// A tuning of a region no group would read is refused, naming why, and
// changes nothing: on the global group a region the global rule has no
// share for, or any region of a rule that is not scope: global; on a
// regional group another region. Its own region's tuning goes through.
func TestTuneRefusesRegionsNoGroupReads(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		group   string // the group's -region; "" the global group
		tuning  *rationv1.Tuning
		refusal string // "" accepted
	}{
		{"", &rationv1.Tuning{Rule: "g", Region: "ap", Weight: f64(2)}, `region "ap": rule "g" is scope: global and has no share for it (its regions: eu, us)`},
		{"", &rationv1.Tuning{Rule: "l", Region: "eu", MinSlice: f64(1)}, `region "eu": rule "l" is not scope: global, and this group serves no region`},
		{"", &rationv1.Tuning{Rule: "g", Region: "eu", Weight: f64(2)}, ""},
		{"eu", &rationv1.Tuning{Rule: "l", Region: "us", MinSlice: f64(1)}, `region "us": this is region "eu"'s group`},
		{"eu", &rationv1.Tuning{Rule: "l", Region: "eu", MinSlice: f64(1)}, ""},
	} {
		c := harness.StartCoordinators(t, 1, tuneRegionRules, func(cfg *coordinator.Config) { cfg.Region = tc.group })
		admin := adminOf(t, c, 0)
		_, err := admin.Tune(ctx, &rationv1.TuneRequest{Tuning: tc.tuning})
		list, lerr := admin.ListTunings(ctx, &rationv1.ListTuningsRequest{})
		if lerr != nil {
			t.Fatal(lerr)
		}
		if tc.refusal == "" {
			if err != nil || len(list.Tunings) != 1 {
				t.Errorf("group %q: Tune(%v) = %v, tunings %v; want it in force", tc.group, tc.tuning, err, list.Tunings)
			}
			continue
		}
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.refusal) || len(list.Tunings) != 0 {
			t.Errorf("group %q: Tune(%v) = %v, tunings %v; want InvalidArgument naming %q and none", tc.group, tc.tuning, err, list.Tunings, tc.refusal)
		}
	}
}
