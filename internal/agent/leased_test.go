package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

const leasedAgentRules = `
rules:
  - name: hot-closed
    match: {hot: closed}
    burst: 1000
    rate: 1000
    mode: leased
    lease: {period: 1s}
  - name: hot-emergency
    match: {hot: emergency}
    burst: 1000
    rate: 1000
    mode: leased
    lease: {period: 1s}
    on_failure: emergency
    emergency: {burst: 3, rate: 0, max_duration: 1m}
`

// Leased rules through the agent's gRPC API against a real 3-node
// coordinator group: decided locally while the lease lives; once every
// coordinator is gone and the lease has expired, each rule's failure policy
// decides (503 for fail_closed, the local emergency bucket for emergency).
func TestLeasedRulesThroughAgent(t *testing.T) {
	c := harness.StartCoordinators(t, 3, leasedAgentRules)
	a := startAgent(t, leasedAgentRules, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
	})
	for _, v := range []string{"closed", "emergency"} {
		resp := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"hot": v}})
		if !resp.Allowed || resp.Reason != rationv1.Reason_REASON_OK {
			t.Fatalf("leased %s with live coordinators = %v, want ok", v, resp)
		}
	}
	if got := metricValue(t, a.srv.Registry, "ration_decisions_total",
		map[string]string{"rule": "hot-closed", "path": "leased", "result": "allowed", "reason": "ok"}); got != 1 {
		t.Fatalf("leased decisions counted = %v, want 1 on path leased", got)
	}
	// Redis holds nothing for leased rules: no network hop per request.
	if n := a.dbsize(t); n != 0 {
		t.Fatalf("Redis has %d keys after leased decisions only, want 0", n)
	}

	for i := 0; i < c.N(); i++ {
		c.Kill(i)
	}
	// The lease lives at most one period (1s) past its last renewal.
	waitFor(t, "the lease to expire", func() bool {
		resp := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"hot": "closed"}})
		return resp.Reason == rationv1.Reason_REASON_UNAVAILABLE
	})
	resp := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"hot": "closed"}})
	if resp.Allowed || agent.CheckStatus(agentResponse(resp)) != 503 {
		t.Fatalf("fail_closed leased rule after expiry = %v, want denied with 503", resp)
	}
	var admitted int
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < 10 && time.Now().Before(deadline); i++ {
		resp := a.allow(t, &rationv1.AllowRequest{Descriptors: map[string]string{"hot": "emergency"}})
		if resp.Reason == rationv1.Reason_REASON_OK {
			i-- // still on the live lease; wait for it to lapse
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if resp.Reason != rationv1.Reason_REASON_EMERGENCY {
			t.Fatalf("emergency leased rule after expiry = %v, want reason emergency", resp)
		}
		if resp.Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("emergency admitted %d of 10 after the lease expired, want its burst 3", admitted)
	}
}

func agentResponse(r *rationv1.AllowResponse) agent.Response {
	reasons := map[rationv1.Reason]agent.Reason{
		rationv1.Reason_REASON_OK: agent.ReasonOK, rationv1.Reason_REASON_OVER_LIMIT: agent.ReasonOverLimit,
		rationv1.Reason_REASON_UNAVAILABLE: agent.ReasonUnavailable, rationv1.Reason_REASON_EMERGENCY: agent.ReasonEmergency,
	}
	return agent.Response{Allowed: r.Allowed, Reason: reasons[r.Reason]}
}

// A leased quota is named rule|subject at the coordinator, which refuses
// names over lease.MaxNameLen bytes, and refuses the WHOLE renewal that
// carries one. So the agent answers such a request at once as invalid
// (400, INVALID_ARGUMENT) naming the rule and the limit, before the
// holder ever sees it; its other leased quotas keep their leases.
func TestLeasedQuotaIDTooLong(t *testing.T) {
	rulesYAML := leasedAgentRules + `
  - name: long-leased
    match: {lhot: "*"}
    burst: 1000
    rate: 1000
    mode: leased
    lease: {period: 1s}
`
	c := harness.StartCoordinators(t, 1, rulesYAML)
	a := startAgent(t, rulesYAML, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
	})
	good := &rationv1.AllowRequest{Descriptors: map[string]string{"hot": "closed"}}
	if resp := a.allow(t, good); !resp.Allowed || resp.Reason != rationv1.Reason_REASON_OK {
		t.Fatalf("good leased quota = %v, want ok", resp)
	}

	v250, v1k := strings.Repeat("v", 250), strings.Repeat("k", 1024)
	// "long-leased|lhot=" + 250 bytes = 267 > 256; the subject form is
	// "long-leased|" + 250 = 262.
	tests := []struct {
		name     string
		desc     map[string]string
		rule     string
		subject  string
		mentions []string
	}{
		{"descriptor 250 bytes", map[string]string{"lhot": v250}, "", "", []string{"long-leased", "267 bytes", "at most 256"}},
		{"subject 250 bytes", nil, "long-leased", v250, []string{"long-leased", "262 bytes", "at most 256"}},
		{"descriptor 1 KiB", map[string]string{"lhot": v1k}, "", "", []string{"1024 bytes", "at most 256"}},
		{"subject 1 KiB", nil, "long-leased", v1k, []string{"1 to 256 bytes", "got 1024"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// gRPC
			_, err := a.rl.Allow(context.Background(), &rationv1.AllowRequest{Descriptors: tt.desc, Rule: tt.rule, Subject: tt.subject})
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("gRPC Allow = %v, want INVALID_ARGUMENT", err)
			}
			for _, m := range tt.mentions {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("gRPC error %q does not mention %q", err, m)
				}
			}
			// HTTP /v1/allow
			body, _ := json.Marshal(map[string]any{"descriptors": tt.desc, "rule": tt.rule, "subject": tt.subject})
			resp, err := http.Post(a.base+"/v1/allow", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			msg, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("POST /v1/allow = %d %s, want 400", resp.StatusCode, msg)
			}
			for _, m := range tt.mentions {
				if !strings.Contains(string(msg), m) {
					t.Errorf("HTTP error %s does not mention %q", msg, m)
				}
			}
			// HTTP /v1/check, descriptors only
			if tt.desc != nil {
				q := url.Values{}
				for k, v := range tt.desc {
					q.Set(k, v)
				}
				resp, err := http.Get(a.base + "/v1/check?" + q.Encode())
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusBadRequest {
					t.Fatalf("GET /v1/check = %d, want 400", resp.StatusCode)
				}
			}
		})
	}

	// The holder never saw them: one quota, no refused renewal. And the
	// good quota keeps its lease over several periods: every decision is
	// admitted on the lease (a refused renewal would let it lapse to
	// fail_closed's 503 within one period).
	// Two: the exact-key rules' quotas, fetched before the agent turned
	// ready.
	if n := metricValue(t, a.srv.Registry, "ration_agent_leased_quotas", nil); n != 2 {
		t.Fatalf("holder has %v leased quotas, want 2 (the long ones must not reach it)", n)
	}
	start := time.Now()
	for i := 0; i < 300 && time.Since(start) < 3*time.Second; i++ {
		if resp := a.allow(t, good); !resp.Allowed || resp.Reason != rationv1.Reason_REASON_OK {
			t.Fatalf("good leased quota after %v = %v, want ok on its lease", time.Since(start).Round(time.Millisecond), resp)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if errs := metricValue(t, a.srv.Registry, "ration_agent_lease_renewals_total", map[string]string{"result": "error"}); errs != 0 {
		t.Fatalf("%v lease renewals failed, want 0", errs)
	}
	if ok := metricValue(t, a.srv.Registry, "ration_agent_lease_renewals_total", map[string]string{"result": "ok"}); ok < 3 {
		t.Fatalf("%v lease renewals succeeded over 3 lease periods, want at least 3", ok)
	}
}

// An AllowBatch of 500 new subjects of a leased rule (a real coordinator):
// the agent asks for all their leases before deciding the first, so their
// grants travel in one or a few Renew requests and the batch waits for one
// round of grants, not for 500 in turn. Every decision is admitted by a
// lease, none by the failure policy.
func TestLeasedBatchOfNewSubjectsGrantedTogether(t *testing.T) {
	const yaml = `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 1000000
    rate: 1000000
    mode: leased
`
	c := harness.StartCoordinators(t, 1, yaml)
	a := startAgent(t, yaml, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
		cfg.FirstGrantTimeout = 5 * time.Second // generous under -race
	})
	const n = 500
	reqs := make([]*rationv1.AllowRequest, n)
	for i := range reqs {
		reqs[i] = &rationv1.AllowRequest{Descriptors: map[string]string{"user": fmt.Sprintf("u%d", i)}}
	}
	start := time.Now()
	resp, err := a.rl.AllowBatch(context.Background(), &rationv1.AllowBatchRequest{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	ok := 0
	for _, r := range resp.GetResponses() {
		if r.Allowed && r.Reason == rationv1.Reason_REASON_OK {
			ok++
		}
	}
	renewals := metricValue(t, a.srv.Registry, "ration_agent_lease_renewals_total", map[string]string{"result": "ok"})
	t.Logf("%d new subjects in one batch: %d admitted in %v, %v Renew requests", n, ok, took, renewals)
	if ok != n {
		t.Errorf("%d of %d new subjects admitted by their lease, want all", ok, n)
	}
	// One request holds up to 1000 items; a few more may go while the
	// batch is being prepared. One per subject means they were serialised.
	if renewals > 10 {
		t.Errorf("%v Renew requests for one batch of %d new subjects, want a few: their grants were asked one after another", renewals, n)
	}
	if fb := metricValue(t, a.srv.Registry, "ration_decisions_total",
		map[string]string{"rule": "per-user", "path": "fallback", "result": "denied", "reason": "unavailable"}); fb != 0 {
		t.Errorf("%v decisions by the failure policy, want 0", fb)
	}
}
