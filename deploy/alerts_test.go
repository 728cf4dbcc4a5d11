package deploy

import (
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

const runbookURL = "https://github.com/ration-dev/ration/blob/main/docs/runbook.md#"

func readAlerts(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	// Prometheus's own parser and validation (what promtool check rules
	// runs): unknown fields, bad durations, PromQL and template errors.
	groups, errs := rulefmt.Parse(b, false, model.LegacyValidation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("prometheus/alerts.yml: %v", err)
	}
	if groups == nil {
		t.FailNow()
	}
	return groups
}

// TestAlerts: the rules parse with Prometheus's parser; every metric,
// label and label value they use is exported by the binaries; each alert
// has a severity, a summary, a description, and a runbook link to a
// section of docs/runbook.md named after it; the alerts the issue asks
// for exist.
func TestAlerts(t *testing.T) {
	groups := readAlerts(t)
	c := newPromChecker(t)
	anchors := runbookAnchors(t)
	seen := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a recording rule (%s): this file is for alerts", g.Name, r.Record)
				continue
			}
			if seen[r.Alert] {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			seen[r.Alert] = true
			c.check(t, "alert "+r.Alert, r.Expr)
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("alert %s: severity %q, want critical or warning", r.Alert, s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[a] == "" {
					t.Errorf("alert %s: no %s annotation", r.Alert, a)
				}
			}
			u := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(u, runbookURL)
			switch {
			case !ok:
				t.Errorf("alert %s: runbook_url %q does not point into %s", r.Alert, u, runbookURL)
			case anchor != strings.ToLower(r.Alert):
				t.Errorf("alert %s: runbook_url anchor %q, want %q (the section named after the alert)", r.Alert, anchor, strings.ToLower(r.Alert))
			case !anchors[anchor]:
				t.Errorf("alert %s: docs/runbook.md has no section #%s", r.Alert, anchor)
			}
		}
	}
	for _, want := range []string{
		"RationStoreUnreachable", "RationEmergencyModeActive", "RationOvershootBoundHigh",
		"RationNoRaftLeader", "RationLeaseRenewalsFailing", "RationDecisionLatencyHigh", "RationCoordinatorMemberUnreachable",
	} {
		if !seen[want] {
			t.Errorf("alert %s missing", want)
		}
	}
}

// runbookAnchors returns the GitHub anchors of docs/runbook.md's headings.
func runbookAnchors(t testing.TB) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	inCode := false
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "```") {
			inCode = !inCode
		}
		if !inCode && strings.HasPrefix(l, "#") {
			out[githubAnchor(strings.TrimLeft(l, "# "))] = true
		}
	}
	return out
}

var anchorDrop = regexp.MustCompile(`[^\p{L}\p{N} _-]`)

// githubAnchor is GitHub's heading slug: lower case, punctuation dropped,
// spaces to hyphens.
func githubAnchor(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	h = anchorDrop.ReplaceAllString(h, "")
	return strings.ReplaceAll(h, " ", "-")
}
