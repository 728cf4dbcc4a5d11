package deploy

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
)

// evalStep is how often the rules are evaluated and the synthetic series
// sampled (Prometheus's evaluation_interval and scrape_interval).
const evalStep = 15 * time.Second

// An alertEval feeds synthetic series to prometheus/alerts.yml, evaluated
// as Prometheus evaluates it (what promtool test rules does: the rules
// package's groups over promqltest's storage, one evaluation every
// evalStep), and checks which alerts of one name fire when.
type alertEval struct {
	alert string
	// forDur is the alert's for: as the test expects it, so that a
	// changed for: shows here first.
	forDur time.Duration
	// series in promqltest's load notation, one sample per evalStep from
	// time 0: "1x7" is eight samples of 1, "0+30x10" counts up by 30,
	// "_" is no sample, "stale" ends the series (a failed scrape).
	series []string
	until  time.Duration // last evaluation
	// checks: at every evaluation in [from, to], exactly these alerts
	// (each its labels but alertname and severity, "k=v,k=v") fire.
	checks []firing
}

type firing struct {
	from, to time.Duration
	want     []string
}

// TestAlertsEvaluate: RationCoordinatorMemberUnreachable,
// RationStoreUnreachable and RationLeaseRenewalsFailing fire on the
// failures they are for, after their for: and not before, and stay silent
// on healthy series and on blips shorter than their for:.
func TestAlertsEvaluate(t *testing.T) {
	const eu = `region="eu",job="ration-coordinator"`
	for _, tc := range []struct {
		name string
		alertEval
	}{
		{
			// node1 of eu is killed at 2m and restarted at 5m: its peers'
			// probes of it fail (0), its own series end. us is healthy but
			// for one probe blip of 30s, which must not page.
			name: "member killed",
			alertEval: alertEval{
				alert:  "RationCoordinatorMemberUnreachable",
				forDur: time.Minute,
				series: []string{
					`ration_coordinator_member_up{` + eu + `,instance="node0",member="node0"} 1x40`,
					`ration_coordinator_member_up{` + eu + `,instance="node0",member="node1"} 1x7 0x11 1x20`,
					`ration_coordinator_member_up{` + eu + `,instance="node0",member="node2"} 1x40`,
					`ration_coordinator_member_up{` + eu + `,instance="node1",member="node0"} 1x7 stale _x11 1x20`,
					`ration_coordinator_member_up{` + eu + `,instance="node1",member="node1"} 1x7 stale _x11 1x20`,
					`ration_coordinator_member_up{` + eu + `,instance="node1",member="node2"} 1x7 stale _x11 1x20`,
					`ration_coordinator_member_up{` + eu + `,instance="node2",member="node0"} 1x40`,
					`ration_coordinator_member_up{` + eu + `,instance="node2",member="node1"} 1x7 0x11 1x20`,
					`ration_coordinator_member_up{` + eu + `,instance="node2",member="node2"} 1x40`,
					`ration_coordinator_member_up{region="us",instance="a",member="a"} 1x40`,
					`ration_coordinator_member_up{region="us",instance="a",member="b"} 1x20 0x1 1x18`,
					`ration_coordinator_member_up{region="us",instance="b",member="a"} 1x40`,
					`ration_coordinator_member_up{region="us",instance="b",member="b"} 1x40`,
				},
				until: 10 * time.Minute,
				checks: []firing{
					{0, 2*time.Minute + 45*time.Second, nil},
					{3 * time.Minute, 4*time.Minute + 45*time.Second, []string{"member=node1,region=eu"}},
					{5 * time.Minute, 10 * time.Minute, nil},
				},
			},
		},
		{
			// One member's view is enough: node2 cut off from node0 alone
			// (node1 still reaches it) from 1m.
			name: "member cut off from one peer",
			alertEval: alertEval{
				alert:  "RationCoordinatorMemberUnreachable",
				forDur: time.Minute,
				series: []string{
					`ration_coordinator_member_up{` + eu + `,instance="node0",member="node2"} 1x3 0x20`,
					`ration_coordinator_member_up{` + eu + `,instance="node1",member="node2"} 1x23`,
				},
				until: 5 * time.Minute,
				checks: []firing{
					{0, time.Minute + 45*time.Second, nil},
					{2 * time.Minute, 5 * time.Minute, []string{"member=node2,region=eu"}},
				},
			},
		},
		{
			// eu's agent a1 opens its breaker at 2m; us's agents see store
			// errors now and then (0.5/s, and canceled calls the store is
			// not blamed for) with their breakers closed.
			name: "breaker open",
			alertEval: alertEval{
				alert:  "RationStoreUnreachable",
				forDur: time.Minute,
				series: []string{
					`ration_breaker_open{region="eu",instance="a1"} 0x7 1x30`,
					`ration_breaker_open{region="eu",instance="a2"} 0x38`,
					`ration_breaker_open{region="us",instance="b1"} 0x38`,
					`ration_store_errors_total{region="us",instance="b1",kind="timeout"} 0+7.5x38`,
					`ration_store_errors_total{region="us",instance="b1",kind="canceled"} 0+300x38`,
					`ration_store_errors_total{region="us",instance="b1",kind="caller_gone"} 0+300x38`,
				},
				until: 8 * time.Minute,
				checks: []firing{
					{0, 2*time.Minute + 45*time.Second, nil},
					{3 * time.Minute, 8 * time.Minute, []string{"region=eu"}},
				},
			},
		},
		{
			// From 3m every store call of eu's agent times out, 20/s, its
			// breaker closed (errors on every node of a Cluster but one):
			// the error rate crosses 1/s at once, then for: runs.
			name: "store errors",
			alertEval: alertEval{
				alert:  "RationStoreUnreachable",
				forDur: time.Minute,
				series: []string{
					`ration_breaker_open{region="eu",instance="a1"} 0x40`,
					`ration_store_errors_total{region="eu",instance="a1",kind="timeout"} 0x12 300+300x28`,
				},
				until: 10 * time.Minute,
				checks: []firing{
					{0, 3*time.Minute + 45*time.Second, nil},
					{4*time.Minute + 30*time.Second, 10 * time.Minute, []string{"region=eu"}},
				},
			},
		},
		{
			// eu's agents renew 10 times a second; from 3m every renewal
			// fails. The 5m rate's ratio passes 0.2 about a minute later,
			// then for: runs 2m. us fails 1 renewal in 11, which is
			// healthy.
			name: "lease renewals fail",
			alertEval: alertEval{
				alert:  "RationLeaseRenewalsFailing",
				forDur: 2 * time.Minute,
				series: []string{
					`ration_agent_lease_renewals_total{region="eu",instance="a1",result="ok"} 0+150x12 1800x40`,
					`ration_agent_lease_renewals_total{region="eu",instance="a1",result="error"} _x12 0+150x40`,
					`ration_agent_lease_renewals_total{region="us",instance="b1",result="ok"} 0+150x52`,
					`ration_agent_lease_renewals_total{region="us",instance="b1",result="error"} 0+15x52`,
				},
				until: 13 * time.Minute,
				checks: []firing{
					{0, 4*time.Minute + 45*time.Second, nil},
					{6*time.Minute + 30*time.Second, 13 * time.Minute, []string{"region=eu"}},
				},
			},
		},
		{
			// eu's leader renews upstream every 15s until 3m, then nothing
			// (its follower never led: 0); us renews throughout; the
			// global group has no upstream (0): neither may page.
			name: "upstream leases lapse",
			alertEval: alertEval{
				alert:  "RationUpstreamLeasesLapsed",
				forDur: 30 * time.Second,
				series: []string{
					`ration_coordinator_upstream_last_success_timestamp_seconds{` + eu + `,instance="node0"} 1+15x12 181x28`,
					`ration_coordinator_upstream_last_success_timestamp_seconds{` + eu + `,instance="node1"} 0x40`,
					`ration_coordinator_upstream_last_success_timestamp_seconds{region="us",instance="a"} 1+15x40`,
					`ration_coordinator_upstream_last_success_timestamp_seconds{region="global",instance="g"} 0x40`,
				},
				until: 10 * time.Minute,
				checks: []firing{
					{0, 4 * time.Minute, nil},
					{4*time.Minute + 15*time.Second, 10 * time.Minute, []string{"region=eu"}},
				},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t)
		})
	}
}

func (a alertEval) run(t *testing.T) {
	var load strings.Builder
	fmt.Fprintf(&load, "load %s\n", model.Duration(evalStep))
	for _, s := range a.series {
		fmt.Fprintf(&load, "  %s\n", s)
	}
	p := parser.NewParser(parser.Options{})
	suite, err := promqltest.NewLazyLoader(load.String(), promqltest.LazyLoaderOpts{StartTime: time.Unix(0, 0).UTC(), Parser: p})
	if err != nil {
		t.Fatalf("series: %v", err)
	}
	t.Cleanup(func() { suite.Close() })
	suite.SubqueryInterval = evalStep

	m := rules.NewManager(&rules.ManagerOptions{
		QueryFunc:    rules.EngineQueryFunc(suite.QueryEngine(), suite.Storage()),
		AppendableV2: suite.Storage(),
		Context:      context.Background(),
		NotifyFunc:   func(context.Context, string, ...*rules.Alert) {},
		Logger:       slog.New(slog.DiscardHandler),
		Parser:       p,
	})
	groups, errs := m.LoadGroups(evalStep, labels.EmptyLabels(), "", nil, false, filepath.Join("prometheus", "alerts.yml"))
	if len(errs) > 0 {
		t.Fatalf("prometheus/alerts.yml: %v", errs)
	}
	var rule *rules.AlertingRule
	for _, g := range groups {
		for _, r := range g.Rules() {
			if ar, ok := r.(*rules.AlertingRule); ok {
				ar.SetRestored(true) // as promtool: no state to restore
				if ar.Name() == a.alert {
					rule = ar
				}
			}
		}
	}
	if rule == nil {
		t.Fatalf("prometheus/alerts.yml has no alert %s", a.alert)
	}
	if rule.HoldDuration() != a.forDur {
		t.Fatalf("%s: for: %s, the test expects %s", a.alert, rule.HoldDuration(), a.forDur)
	}

	start := time.Unix(0, 0).UTC()
	var prev []string
	for at := time.Duration(0); at <= a.until; at += evalStep {
		ts := start.Add(at)
		suite.WithSamplesTill(ts, func(err error) {
			if err != nil {
				t.Fatalf("at %s: %v", at, err)
			}
			for _, g := range groups {
				g.Eval(suite.Context(), ts)
			}
		})
		if err := rule.LastError(); err != nil {
			t.Fatalf("%s at %s: %v", a.alert, at, err)
		}
		var got []string
		for _, al := range rule.ActiveAlerts() {
			if al.State == rules.StateFiring {
				got = append(got, identity(al))
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, prev) {
			t.Logf("%s at %s: firing %q", a.alert, at, got)
			prev = got
		}
		for _, c := range a.checks {
			if at >= c.from && at <= c.to && !slices.Equal(got, c.want) {
				t.Errorf("%s at %s: firing %q, want %q (expression %s, for %s)", a.alert, at, got, c.want, rule.Query(), a.forDur)
			}
		}
	}
}

// identity is an alert's labels, but the rule's own (alertname, severity).
func identity(a *rules.Alert) string {
	var kv []string
	a.Labels.Range(func(l labels.Label) {
		if l.Name != "alertname" && l.Name != "severity" {
			kv = append(kv, l.Name+"="+l.Value)
		}
	})
	return strings.Join(kv, ",")
}
