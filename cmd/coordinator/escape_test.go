package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// TestCommandsEscapeNames: holder names and subjects come from clients.
// One holding a lease under a name full of terminal escapes (clear the
// screen, retitle the window, a bidirectional override, the 8-bit CSI, a
// tab that would shift the columns) is printed by `leases` and
// `quotas` with those escaped, never raw.
func TestCommandsEscapeNames(t *testing.T) {
	c := harness.StartCoordinators(t, 1, string(devRules), func(cfg *coordinator.Config) { cfg.TickInterval = time.Hour })
	_, ln := c.Leader(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const (
		holder  = "gw\x1b[2J\x1b]0;owned\x07/1\tx"
		subject = "acme\u202egnp.exe\u009b2J"
	)
	client := c.Client(coordinator.ClientOptions{})
	resp, err := client.Renew(ctx, &rationv1.RenewRequest{Holder: holder, Seq: 1,
		Items: []*rationv1.RenewItem{{Quota: &rationv1.QuotaRef{Rule: "tenant-reports", Subject: subject}, Demand: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if e := resp.Grants[0].Error; e != "" {
		t.Fatalf("grant: %s", e)
	}
	for _, cmd := range [][]string{{"leases", "-addr", ln.AdminAddr()}, {"quotas", "-addr", ln.AdminAddr()}} {
		var out bytes.Buffer
		if err := run(ctx, cmd, &out, &bytes.Buffer{}, noEnv); err != nil {
			t.Fatalf("%s: %v", cmd[0], err)
		}
		got := out.String()
		for _, raw := range []string{"\x1b", "\x07", "\u202e", "\u009b", "x\t"} {
			if strings.Contains(got, raw) {
				t.Errorf("%s prints %q raw:\n%q", cmd[0], raw, got)
			}
		}
		want := `acme\u202egnp.exe\x9b2J`
		if cmd[0] == "leases" {
			want = `gw\x1b[2J\x1b]0;owned\x07/1\x09x`
		}
		if !strings.Contains(got, want) {
			t.Errorf("%s does not print %s escaped:\n%s", cmd[0], want, got)
		}
	}
}
