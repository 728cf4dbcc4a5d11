package agent_test

import (
	"context"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ration-dev/ration/client/header"
	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/agent"
)

const envoyRules = `
rules:
  - name: per-ip
    match: {remote_address: "*"}
    burst: 3
    rate: 0.5
  - name: edge-search
    match: {domain: edge, generic_key: search}
    burst: 2
    rate: 0
  - name: per-user
    match: {user: "*"}
    burst: 10
    rate: 0
  - name: closed
    match: {p: closed}
    burst: 5
    rate: 0
    on_failure: fail_closed
  - name: open
    match: {p: open}
    burst: 5
    rate: 0
    on_failure: fail_open
  - name: emerg
    match: {p: emerg}
    burst: 5
    rate: 0
    on_failure: emergency
    emergency: {burst: 1, rate: 0.5, max_duration: 1m}
`

// envoyClient dials the agent's gRPC listener with the go-control-plane
// generated client: the service, method and messages Envoy's rate-limit
// filter sends.
func envoyClient(t *testing.T, a *testAgent) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(a.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// descriptor builds a RateLimitDescriptor from key, value pairs in order,
// as Envoy's rate limit actions do.
func descriptor(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func shouldRateLimit(t *testing.T, c rlsv3.RateLimitServiceClient, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, r)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", r, err)
	}
	if len(resp.Statuses) != len(r.Descriptors) {
		t.Fatalf("ShouldRateLimit(%v): %d statuses for %d descriptors", r, len(resp.Statuses), len(r.Descriptors))
	}
	return resp
}

// envoyHeaders returns response_headers_to_add as a map, failing on a
// repeated key (Envoy would add both).
func envoyHeaders(t *testing.T, resp *rlsv3.RateLimitResponse) map[string]string {
	t.Helper()
	h := map[string]string{}
	for _, hv := range resp.ResponseHeadersToAdd {
		if _, dup := h[hv.Key]; dup {
			t.Fatalf("header %s added twice: %v", hv.Key, resp.ResponseHeadersToAdd)
		}
		h[hv.Key] = hv.Value
	}
	return h
}

// One descriptor through the Envoy API: OK with the rule's limit and the
// draft-11 fields until the burst is spent, then OVER_LIMIT with
// Retry-After.
func TestEnvoyOverLimitWithHeaders(t *testing.T) {
	a := startAgent(t, envoyRules)
	c := envoyClient(t, a)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("remote_address", "10.0.0.1")}}
	for i := 0; i < 3; i++ {
		resp := shouldRateLimit(t, c, req)
		st := resp.Statuses[0]
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || st.Code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d = %v, want OK", i, resp)
		}
		lim := st.CurrentLimit
		if lim.GetName() != "per-ip" || lim.GetRequestsPerUnit() != 3 || lim.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || lim.GetUnitMultiplier().GetValue() != 6 {
			t.Fatalf("call %d current_limit = %v, want per-ip, 3 per 6 SECONDs (burst 3 at 0.5/s)", i, lim)
		}
		if want := uint32(2 - i); st.LimitRemaining != want {
			t.Fatalf("call %d limit_remaining = %d, want %d", i, st.LimitRemaining, want)
		}
		h := envoyHeaders(t, resp)
		if h["RateLimit-Policy"] != `"per-ip";q=3;w=6` {
			t.Fatalf("call %d RateLimit-Policy = %q", i, h["RateLimit-Policy"])
		}
		items, err := header.ParseRateLimit(h["RateLimit"])
		if err != nil || len(items) != 1 || items[0].Name != "per-ip" || items[0].Remaining != int64(2-i) {
			t.Fatalf("call %d RateLimit = %q (%v), want per-ip with r=%d", i, h["RateLimit"], err, 2-i)
		}
		if _, ok := h["Retry-After"]; ok {
			t.Fatalf("call %d admitted with Retry-After %q", i, h["Retry-After"])
		}
	}
	resp := shouldRateLimit(t, c, req)
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4th call = %v, want OVER_LIMIT", resp)
	}
	h := envoyHeaders(t, resp)
	// One token at 0.5/s is at most 2 s away, rounded up to whole seconds.
	if ra := h["Retry-After"]; ra != "1" && ra != "2" {
		t.Fatalf("Retry-After = %q, want 1 or 2", ra)
	}
	if !strings.HasPrefix(h["RateLimit"], `"per-ip";r=0;`) || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("over limit RateLimit = %q remaining %d, want r=0", h["RateLimit"], resp.Statuses[0].LimitRemaining)
	}
	// Another address has its own bucket.
	other := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("remote_address", "10.0.0.2")}}
	if resp := shouldRateLimit(t, c, other); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("another address = %v, want OK", resp)
	}
}

// hits_addend is the cost: per request, overridden per descriptor.
func TestEnvoyHitsAddend(t *testing.T) {
	a := startAgent(t, envoyRules)
	c := envoyClient(t, a)
	user := func(hits uint32, perDescriptor *wrapperspb.UInt64Value) *rlsv3.RateLimitResponse {
		d := descriptor("user", "alice")
		d.HitsAddend = perDescriptor
		return shouldRateLimit(t, c, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: hits, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	}
	if got := user(4, nil).Statuses[0].LimitRemaining; got != 6 {
		t.Fatalf("after hits_addend 4: remaining %d, want 6 of 10", got)
	}
	// The descriptor's own hits_addend wins over the request's.
	if got := user(4, wrapperspb.UInt64(5)).Statuses[0].LimitRemaining; got != 1 {
		t.Fatalf("after descriptor hits_addend 5: remaining %d, want 1", got)
	}
	// 0 means the default: the request's value, then 1.
	if got := user(0, wrapperspb.UInt64(0)).Statuses[0].LimitRemaining; got != 0 {
		t.Fatalf("after hits_addend 0: remaining %d, want 0 (charged 1)", got)
	}
	if resp := user(1, nil); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("with nothing left = %v, want OVER_LIMIT", resp)
	}
}

// Several descriptors: per-descriptor statuses, OVER_LIMIT if any is, and a
// rejected request charges none of them. The domain scopes rules that name
// it.
func TestEnvoyDescriptorsAndDomain(t *testing.T) {
	a := startAgent(t, envoyRules)
	c := envoyClient(t, a)
	req := func(domain string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{
			descriptor("user", "bob"),
			descriptor("generic_key", "search"),
		}}
	}
	for i := 0; i < 2; i++ {
		resp := shouldRateLimit(t, c, req("edge"))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d = %v, want OK", i, resp)
		}
		if got := envoyHeaders(t, resp)["RateLimit-Policy"]; got != `"per-user";q=10, "edge-search";q=2` {
			t.Fatalf("call %d RateLimit-Policy = %q, want both rules in descriptor order", i, got)
		}
	}
	resp := shouldRateLimit(t, c, req("edge"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT ||
		resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK || resp.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("3rd call = %v, want OVER_LIMIT overall, user OK, search OVER_LIMIT", resp)
	}
	if _, ok := envoyHeaders(t, resp)["Retry-After"]; ok {
		t.Fatalf("Retry-After on a denial by a rate-0 rule, where no wait helps: %v", resp.ResponseHeadersToAdd)
	}
	// bob was charged by the two admitted calls only: the rejected one was
	// refunded, so 8 are left.
	alone := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "bob")}}
	if got := shouldRateLimit(t, c, alone).Statuses[0].LimitRemaining; got != 7 {
		t.Fatalf("bob's remaining after 2 admitted + 1 rejected + this one = %d, want 7 (the rejected call refunded)", got)
	}
	// Another domain: edge-search does not apply; no rule matches search.
	resp = shouldRateLimit(t, c, req("internal"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[1].CurrentLimit != nil {
		t.Fatalf("domain internal = %v, want OK with no limit on the search descriptor", resp)
	}
}

// Invalid requests answer INVALID_ARGUMENT (Envoy counts an error and
// applies failure_mode_deny) and touch no bucket.
func TestEnvoyInvalidTouchesNothing(t *testing.T) {
	a := startAgent(t, envoyRules)
	c := envoyClient(t, a)
	negative := descriptor("user", "a")
	negative.IsNegativeHits = true
	override := descriptor("user", "a")
	override.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}
	tests := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "edge"}, "no descriptors"},
		{"empty descriptor", &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{{}}}, "no descriptors"},
		{"conflicting key", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("header_match", "a", "header_match", "b")}}, "given twice"},
		{"domain entry", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("domain", "other")}}, "conflicts with the request's domain"},
		{"cost above burst", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 11, Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "a")}}, "cost exceeds burst"},
		{"negative hits", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{negative}}, "is_negative_hits"},
		{"limit override", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{override}}, "limit overrides"},
		{"long value", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", strings.Repeat("x", 300))}}, "at most 256"},
		// The valid first descriptor is not charged either.
		{"second invalid", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "a"), descriptor("", "x")}}, "descriptor 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.ShouldRateLimit(context.Background(), tt.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ShouldRateLimit = %v, want InvalidArgument mentioning %q", err, tt.want)
			}
		})
	}
	if n := a.dbsize(t); n != 0 {
		t.Fatalf("Redis holds %d keys after only invalid requests, want 0", n)
	}
}

// With Redis down, a fail_closed rule makes the call fail with UNAVAILABLE
// (Envoy's failure_mode_deny then decides, as when the agent is down), a
// fail_open rule answers OK, and a spent quota still answers OVER_LIMIT.
func TestEnvoyStoreDownPolicies(t *testing.T) {
	// A short decision timeout: with Redis down, each decision waits that long.
	a := startAgent(t, envoyRules, func(cfg *agent.Config) { cfg.DecisionTimeout = 200 * time.Millisecond })
	c := envoyClient(t, a)
	one := func(kv ...string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor(kv...)}}
	}
	if resp := shouldRateLimit(t, c, one("p", "closed")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("healthy fail_closed = %v, want OK", resp)
	}
	a.redis.Stop()

	_, err := c.ShouldRateLimit(context.Background(), one("p", "closed"))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("fail_closed with Redis down = %v, want UNAVAILABLE naming the rule", err)
	}
	resp := shouldRateLimit(t, c, one("p", "open"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("fail_open with Redis down = %v, want OK", resp)
	}
	// No bucket was read: no quota to report.
	if h := envoyHeaders(t, resp); h["RateLimit"] != "" || h["RateLimit-Policy"] != "" || resp.Statuses[0].DurationUntilReset != nil {
		t.Fatalf("fail_open admission reports a quota: %v", resp)
	}
	// The emergency bucket (1 token) admits once, then denies: OVER_LIMIT,
	// which outranks a fail_closed descriptor in the same call. Retry-After
	// covers both (the emergency refill, at least the 1s of a 503).
	if resp := shouldRateLimit(t, c, one("p", "emerg")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first emergency = %v, want OK from the local bucket", resp)
	}
	mixed := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("p", "closed"), descriptor("p", "emerg")}}
	resp = shouldRateLimit(t, c, mixed)
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("fail_closed + spent emergency = %v, want OVER_LIMIT for both", resp)
	}
	h := envoyHeaders(t, resp)
	if ra := h["Retry-After"]; ra != "1" && ra != "2" {
		t.Fatalf("Retry-After = %q, want 1 or 2", ra)
	}
	if items, err := header.ParseRateLimit(h["RateLimit"]); err != nil || len(items) != 1 || items[0].Name != "emerg" {
		t.Fatalf("RateLimit = %q (%v), want the emergency bucket only (the fail_closed rule read none)", h["RateLimit"], err)
	}
	// A fail_closed descriptor next to a fail_open one still fails the call.
	both := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("p", "open"), descriptor("p", "closed")}}
	if _, err := c.ShouldRateLimit(context.Background(), both); status.Code(err) != codes.Unavailable {
		t.Fatalf("fail_open + fail_closed with Redis down = %v, want UNAVAILABLE", err)
	}
	// With Redis back the agent shuts down at once at cleanup.
	a.redis.Restart()
}

// ShouldRateLimit decisions go to -record like Allow's: one line per
// descriptor and rule, and when the call is over limit every line of it
// says not admitted (its other descriptors' charges were refunded).
func TestEnvoyDecisionsRecorded(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "adm.log")
	a := startAgent(t, envoyRules, func(cfg *agent.Config) { cfg.Record = logPath; cfg.AgentID = "envoy-rec" })
	c := envoyClient(t, a)
	// edge-search (burst 2) and per-user (burst 10) in one call: two
	// calls admitted, the third over limit on edge-search.
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		descriptor("generic_key", "search"), descriptor("user", "carol"),
	}}
	want := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}
	for i, w := range want {
		if resp := shouldRateLimit(t, c, req); resp.OverallCode != w {
			t.Fatalf("call %d = %v, want %v", i, resp.OverallCode, w)
		}
	}
	recs := readLog(t, logPath)
	admitted := map[string]int{}
	denied := map[string]int{}
	for _, r := range recs {
		if r.Agent != "envoy-rec" || r.Path != "store" {
			t.Errorf("record %+v: want agent envoy-rec, path store", r)
		}
		if r.Allowed {
			admitted[r.Quota]++
		} else {
			denied[r.Quota]++
		}
	}
	wantAdmitted := map[string]int{"edge-search|": 2, "per-user|user=carol": 2}
	wantDenied := map[string]int{"edge-search|": 1, "per-user|user=carol": 1}
	if len(recs) != 6 || !maps.Equal(admitted, wantAdmitted) || !maps.Equal(denied, wantDenied) {
		t.Fatalf("recorded %d lines, admitted %v denied %v; want 6 lines, admitted %v denied %v", len(recs), admitted, denied, wantAdmitted, wantDenied)
	}
	reps := admission.CheckAll(recs)
	for _, rep := range reps {
		if rep.Overshoot > 0 {
			t.Errorf("%s: overshoot %v", rep.Quota, rep.Overshoot)
		}
	}
}
