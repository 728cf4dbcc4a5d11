package coordinator_test

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
)

// The status page of a regional group's leader shows its upstream link:
// renewals succeeding, the quotas the upstream leases fund; a follower's
// says the leader renews.
func TestStatusUpstreamView(t *testing.T) {
	hr := startHierarchy(t, hierRules, 1, 2, 1, []string{"eu"}, func(c *coordinator.Config) { c.HTTPAddr = "127.0.0.1:0" })
	hr.drive("g", "x", 2*time.Second, func(*regionAgent, time.Duration) float64 { return 20 })
	eu := hr.regions["eu"]
	li, leader := eu.Leader(t)
	type view struct {
		Upstream *struct {
			Renewing bool    `json:"renewing"`
			Healthy  bool    `json:"healthy"`
			OK       int64   `json:"renewals_ok"`
			Funded   int     `json:"funded_quotas"`
			Rate     float64 `json:"funded_rate"`
		} `json:"upstream_status"`
	}
	get := func(addr string) view {
		t.Helper()
		resp, err := http.Get("http://" + addr + "/status.json")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v view
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		v := get(leader.HTTPAddr())
		u := v.Upstream
		if u != nil && u.Renewing && u.Healthy && u.OK > 0 && u.Funded >= 1 && u.Rate > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("regional leader's upstream view: %+v, want renewing, healthy, a funded quota", u)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if u := get(eu.Node((li + 1) % 2).HTTPAddr()).Upstream; u == nil || u.Renewing {
		t.Errorf("regional follower's upstream view: %+v, want one that is not renewing", u)
	}
	resp, err := http.Get("http://" + leader.HTTPAddr() + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// (The renewals' health may have changed since: only the part's
	// presence is checked here, its values above.)
	if !strings.Contains(string(page), `id="upstream"`) || !regexp.MustCompile(`class="renewal-health">.*\(\d+ ok, \d+ failed`).Match(page) {
		t.Errorf("regional leader's page lacks its upstream part:\n%s", page)
	}
}
