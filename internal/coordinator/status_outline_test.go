package coordinator_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// TestStatusPageIsAnOutline runs a coordinator with mutual TLS, where
// ListLeases and ListTunings need an operator's certificate, and an agent
// holding a lease of a tenant's quota, under a tuning. The status page and
// /status.json, read with no credentials on -http, show the quota's rule,
// rates and lease count, and none of the holder's name, the lease id, the
// tenant's name or the tuning's settings.
func TestStatusPageIsAnOutline(t *testing.T) {
	pki := harness.NewPKI(t)
	c := harness.StartCoordinatorsTLS(t, 1, testRules, pki, noTicks, func(cfg *coordinator.Config) { cfg.HTTPAddr = "127.0.0.1:0" })
	_, ln := c.Leader(t)
	ctx := timeout(t, 60*time.Second)
	const (
		holderName = "gw-secret-host/7f3a"
		tenant     = "tenant-initech-secret"
	)
	agent := tlsClient(c, pki, pki.Agent("gw-secret-host"))
	h := newHolder(holderName)
	quota := []*rationv1.QuotaRef{{Rule: "per-tenant", Subject: tenant}}
	req := h.request(quota, 3)
	resp, err := agent.Renew(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.adopt(req, resp); err != nil {
		t.Fatal(err)
	}
	leaseID := h.leases[qid(quota[0])].GetLeaseId()
	ops := adminWith(t, ln.AdminAddr(), pki.DialOptions(pki.Operator("ops")))
	if _, err := ops.Tune(ctx, &rationv1.TuneRequest{Tuning: &rationv1.Tuning{Rule: "per-tenant", MaxSlice: f64(3.25)}}); err != nil {
		t.Fatal(err)
	}

	get := func(path string) string {
		t.Helper()
		resp, err := http.Get("http://" + ln.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
		}
		return string(body)
	}
	secrets := []string{holderName, "gw-secret-host", tenant, "data-lease", `"holder"`, `class="tuning"`, "max_slice=3.25"}
	for _, path := range []string{"/", "/?part=body", "/status.json"} {
		body := get(path)
		for _, s := range secrets {
			if strings.Contains(body, s) {
				t.Errorf("GET %s tells anyone %q", path, s)
			}
		}
	}

	var js struct {
		Outline bool `json:"outline"`
		Quotas  []struct {
			Rule       string            `json:"rule"`
			Subject    string            `json:"subject"`
			LiveLeases int               `json:"live_leases"`
			Leases     []json.RawMessage `json:"leases"`
		} `json:"quotas"`
		Tunings      []json.RawMessage `json:"tunings"`
		TuningsTotal int               `json:"tunings_total"`
	}
	if err := json.Unmarshal([]byte(get("/status.json")), &js); err != nil {
		t.Fatal(err)
	}
	if !js.Outline || len(js.Quotas) != 1 || js.Quotas[0].Rule != "per-tenant" || js.Quotas[0].Subject != "#1" ||
		js.Quotas[0].LiveLeases != 1 || len(js.Quotas[0].Leases) != 0 || len(js.Tunings) != 0 || js.TuningsTotal != 1 {
		t.Errorf("status.json = %+v, want an outline: quota per-tenant #1 with 1 live lease listed by none, 1 tuning counted", js)
	}
	if page := get("/"); !strings.Contains(page, "1 live lease") {
		t.Errorf("the page does not count the lease:\n%s", page)
	}
	// The lease id is a small number: it must not appear as one.
	if strings.Contains(get("/status.json"), `"id": `+strconv.FormatUint(leaseID, 10)) {
		t.Errorf("status.json names lease %d", leaseID)
	}
}
