package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// -safe-share and -allow-overshoot reach the request only when given, and
// the tunings table shows a pending safe-share change.
func TestTuneFlagsSafeShare(t *testing.T) {
	parse := func(args ...string) *rationv1.TuneRequest {
		t.Helper()
		var f tuneFlags
		fs := flag.NewFlagSet("tune", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f.bind(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		req, err := f.request(fs)
		if err != nil {
			t.Fatal(err)
		}
		return req
	}
	req := parse("-rule", "g", "-region", "eu", "-safe-share", "0", "-allow-overshoot")
	if req.Tuning.SafeShare == nil || *req.Tuning.SafeShare != 0 || !req.AllowOvershoot {
		t.Errorf("request = %v, want safe_share 0 and allow_overshoot", req)
	}
	if req := parse("-rule", "g", "-region", "eu", "-weight", "2"); req.Tuning.SafeShare != nil || req.AllowOvershoot {
		t.Errorf("request = %v, want no safe share", req)
	}
	to, from := 30.0, 20.0
	var out bytes.Buffer
	printTunings(&out, []*rationv1.Tuning{{Rule: "g", Region: "eu", SafeShare: &to, SafeSharePendingFrom: &from}})
	if !regexp.MustCompile(`g\s+eu\s+-\s+-\s+-\s+-\s+-\s+30 \(pending from 20\)`).MatchString(out.String()) {
		t.Errorf("tunings printed %q, want safe share 30 pending from 20", out.String())
	}
}

// tune against a real node: a rate prints as the status page writes it
// (10/3 as 3.333), and -clear says what it removed and what is in force
// now, not the removed row.
func TestTuneClearAndNumbers(t *testing.T) {
	c := harness.StartCoordinators(t, 1, string(devRules))
	addr := c.Node(0).AdminAddr()
	tune := func(args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := run(context.Background(), append([]string{"tune", "-addr", addr}, args...), &out, &errOut, noEnv); err != nil {
			t.Fatalf("tune %q: %v\n%s", args, err, errOut.String())
		}
		return out.String()
	}
	rule := leasedExampleRule(t)
	out := tune("-rule", rule, "-min-slice", strconv.FormatFloat(10.0/3, 'g', -1, 64))
	if !strings.Contains(out, " 3.333 ") || strings.Contains(out, "3.3333") {
		t.Errorf("tune printed:\n%s\nwant min slice 3.333", out)
	}
	out = tune("-rule", rule, "-clear")
	want := "cleared the tuning of rule " + rule + " (its default for every region)\nin force now: the rules file's lease settings\n"
	if out != want {
		t.Errorf("tune -clear printed:\n%s\nwant:\n%s", out, want)
	}
}

// leasedExampleRule is the first leased rule of examples/rules.yaml.
func leasedExampleRule(t *testing.T) string {
	t.Helper()
	set, err := rules.Parse("rules.yaml", devRules)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range set.Rules() {
		if r.Mode == rules.ModeLeased {
			return r.Name
		}
	}
	t.Fatal("examples/rules.yaml has no leased rule")
	return ""
}
