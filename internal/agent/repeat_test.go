package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// A batch's runs of one request (the same bytes on the wire, read once
// and decided from the first one's match) are answered as if each were
// its own: each charged in order, a run of invalid requests refused each
// with the unary error, request ids still replayed, and a run broken by
// another request picked up again after it.
func TestBatchRunsOfOneRequest(t *testing.T) {
	const yaml = `
rules:
  - name: by-user
    match: {user: "*"}
    burst: 5
    rate: 0.0001
`
	a := startAgent(t, yaml)
	ann := func() *rationv1.AllowRequest {
		return &rationv1.AllowRequest{Descriptors: map[string]string{"user": "ann"}}
	}
	bob := &rationv1.AllowRequest{Rule: "by-user", Subject: "bob", Cost: 2}
	bad := &rationv1.AllowRequest{Descriptors: map[string]string{"user": "x"}, Cost: -1}
	withID := &rationv1.AllowRequest{Rule: "by-user", Subject: "carol", RequestId: "r-1"}
	reqs := []*rationv1.AllowRequest{
		ann(), ann(), ann(), // ann: 3 of 5
		bob, bob, bob, // bob: 2+2, then 1 left < 2
		bad, bad,
		ann(), ann(), ann(), // ann: 2 more admitted, then denied
		withID, withID, // one charge, the second a replay
		ann(),
		{Rule: "by-user", Subject: "dan"}, {Rule: "by-user", Subject: "dan", Cost: 1}, {Rule: "by-user", Subject: "dan", Cost: 3},
	}
	resp, err := a.rl.AllowBatch(context.Background(), &rationv1.AllowBatchRequest{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	_, unaryErr := a.rl.Allow(context.Background(), bad)
	if status.Code(unaryErr) != codes.InvalidArgument {
		t.Fatalf("unary Allow of the invalid request: %v, want InvalidArgument", unaryErr)
	}
	want := []struct {
		allowed   bool
		remaining int64
	}{
		{true, 4}, {true, 3}, {true, 2},
		{true, 3}, {true, 1}, {false, 1},
		{}, {},
		{true, 1}, {true, 0}, {false, 0},
		{true, 4}, {true, 4},
		{false, 0},
		{true, 4}, {true, 3}, {true, 0}, // cost 0 is 1: the same question; cost 3 is not
	}
	for i, r := range resp.GetResponses() {
		if i == 6 || i == 7 {
			if r.Reason != rationv1.Reason_REASON_INVALID || r.Error != status.Convert(unaryErr).Message() {
				t.Errorf("request %d (invalid, repeated): %v, want the unary refusal %q", i, r, status.Convert(unaryErr).Message())
			}
			continue
		}
		if r.Allowed != want[i].allowed || r.Remaining != want[i].remaining || r.Rule != "by-user" {
			t.Errorf("request %d: allowed %v, remaining %d (%v); want allowed %v, remaining %d", i, r.Allowed, r.Remaining, r, want[i].allowed, want[i].remaining)
		}
	}
	if n := len(resp.GetResponses()); n != len(reqs) {
		t.Fatalf("%d answers to %d requests", n, len(reqs))
	}
}

// A batch of one leased subject spends its lease through one quota found
// once: never more than the lease holds (burst 100, one agent, a rate
// that hardly refills), every decision counted.
func TestBatchRunOfOneLeasedSubject(t *testing.T) {
	const yaml = `
rules:
  - name: hot
    match: {tenant: "*"}
    burst: 100
    rate: 0.001
    mode: leased
    lease: {period: 1s}
`
	c := harness.StartCoordinators(t, 1, yaml)
	a := startAgent(t, yaml, func(cfg *agent.Config) {
		cfg.Coordinators = strings.Join(c.GRPCAddrs(), ",")
		cfg.DecisionTimeout = 2 * time.Second
	})
	reqs := make([]*rationv1.AllowRequest, 300)
	for i := range reqs {
		reqs[i] = &rationv1.AllowRequest{Descriptors: map[string]string{"tenant": "t1"}}
	}
	admitted := 0
	for range 2 {
		resp, err := a.rl.AllowBatch(context.Background(), &rationv1.AllowBatchRequest{Requests: reqs})
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range resp.GetResponses() {
			switch {
			case r.Allowed && r.Reason == rationv1.Reason_REASON_OK:
				admitted++
			case !r.Allowed && r.Reason == rationv1.Reason_REASON_OVER_LIMIT:
			default:
				t.Fatalf("decision %d: %v, want admitted or over_limit on the lease", i, r)
			}
		}
	}
	// Two subjects in runs, one after the other: each run spends its own
	// quota's lease (the second's first answer is a fresh lease's, not
	// the first's fourth).
	two := make([]*rationv1.AllowRequest, 6)
	for i := range two {
		two[i] = &rationv1.AllowRequest{Descriptors: map[string]string{"tenant": []string{"t2", "t3"}[i/3]}}
	}
	resp, err := a.rl.AllowBatch(context.Background(), &rationv1.AllowBatchRequest{Requests: two})
	if err != nil {
		t.Fatal(err)
	}
	rs := resp.GetResponses()
	for i, r := range rs {
		if !r.Allowed {
			t.Fatalf("runs of t2 and t3, decision %d: %v, want admitted", i, r)
		}
	}
	if rs[0].Remaining != rs[3].Remaining || rs[1].Remaining != rs[4].Remaining || rs[0].Remaining <= rs[2].Remaining {
		t.Errorf("runs of two fresh subjects: remaining %d %d %d then %d %d %d, want each run to start from its own lease",
			rs[0].Remaining, rs[1].Remaining, rs[2].Remaining, rs[3].Remaining, rs[4].Remaining, rs[5].Remaining)
	}
	if admitted > 100 || admitted < 50 {
		t.Fatalf("admitted %d of 600 on a lease of burst 100 (rate 0.001/s): want at most 100, and the lease spent", admitted)
	}
	counted := metricValue(t, a.srv.Registry, "ration_decisions_total", map[string]string{"rule": "hot", "path": "leased", "result": "allowed", "reason": "ok"})
	if counted != float64(admitted+len(two)) {
		t.Errorf("ration_decisions_total{path=leased,result=allowed} = %v, want %d", counted, admitted+len(two))
	}
}
