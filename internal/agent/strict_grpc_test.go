package agent_test

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// rawCodec sends and receives messages as the bytes given: a client's
// proto.Marshal refuses strings that are not UTF-8, a hostile client
// does not.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" }
func appendStr(b []byte, num int, s string) []byte {
	return protowire.AppendString(protowire.AppendTag(b, protowire.Number(num), protowire.BytesType), s)
}

// rawAllow is an AllowRequest written field by field, its strings as they
// are (descriptors in the order given, as key, value, key, value...).
type rawAllow struct {
	desc                   []string
	rule, subject, request string
	cost                   float64
}

func (r rawAllow) wire() []byte {
	var b []byte
	for i := 0; i+1 < len(r.desc); i += 2 {
		e := appendStr(appendStr(nil, 1, r.desc[i]), 2, r.desc[i+1])
		b = protowire.AppendBytes(protowire.AppendTag(b, 1, protowire.BytesType), e)
	}
	if r.rule != "" {
		b = appendStr(b, 2, r.rule)
	}
	if r.subject != "" {
		b = appendStr(b, 3, r.subject)
	}
	if r.cost != 0 {
		b = protowire.AppendFixed64(protowire.AppendTag(b, 4, protowire.Fixed64Type), math.Float64bits(r.cost))
	}
	if r.request != "" {
		b = appendStr(b, 5, r.request)
	}
	return b
}

// json is the same request as a /v1/allow body, its strings as they are.
func (r rawAllow) json() string {
	var f []string
	if len(r.desc) > 0 {
		var d []string
		for i := 0; i+1 < len(r.desc); i += 2 {
			d = append(d, `"`+r.desc[i]+`":"`+r.desc[i+1]+`"`)
		}
		f = append(f, `"descriptors":{`+strings.Join(d, ",")+`}`)
	}
	for _, kv := range [][2]string{{"rule", r.rule}, {"subject", r.subject}, {"request_id", r.request}} {
		if kv[1] != "" {
			f = append(f, `"`+kv[0]+`":"`+kv[1]+`"`)
		}
	}
	return "{" + strings.Join(f, ",") + "}"
}

// A string that is not UTF-8 is refused the same way on HTTP and gRPC:
// 400 and INVALID_ARGUMENT (Allow, AllowBatch; an AllowStream request's
// own REASON_INVALID answer, the stream going on), each naming the field,
// and nothing is charged, not even a batch's good requests.
func TestInvalidUTF8RefusedAlikeOnHTTPAndGRPC(t *testing.T) {
	a := startAgent(t, strictRules)
	conn, err := grpc.NewClient(a.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	raw := grpc.ForceCodec(rawCodec{})
	tests := []struct {
		name       string
		req        func(u string) rawAllow
		grpcField  string
		httpField  string
		probeValue string // a user value the request could be taken for
	}{
		{"subject", func(u string) rawAllow { return rawAllow{rule: "per-user", subject: "user=" + u + "\xff"} },
			"subject:", `"subject"`, "\uFFFD"},
		{"descriptor value", func(u string) rawAllow { return rawAllow{desc: []string{"user", u + "\xfe"}} },
			`descriptors["user"]`, `descriptors["user"]`, "\uFFFD"},
		{"descriptor key", func(u string) rawAllow { return rawAllow{desc: []string{"user\xff", u, "tenant", u}} },
			`descriptors: key "user\xff"`, `"descriptors": key`, ""},
		{"request_id", func(u string) rawAllow { return rawAllow{desc: []string{"user", u}, request: "r\xc3"} },
			"request_id:", `"request_id"`, ""},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := "g" + string(rune('a'+i))
			bad := tt.req(u)
			var probe map[string]string
			if tt.probeValue != "" {
				probe = map[string]string{"user": u + tt.probeValue}
			}

			invalidBefore := metricValue(t, a.srv.Registry, "ration_requests_invalid_total", nil)
			in, out := bad.wire(), []byte(nil)
			err := conn.Invoke(ctx, rationv1.RateLimiter_Allow_FullMethodName, &in, &out, raw)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.grpcField) {
				t.Errorf("Allow = %v, want INVALID_ARGUMENT naming %s", err, tt.grpcField)
			}

			good := rawAllow{desc: []string{"tenant", u + "-batch"}}.wire()
			var batch []byte
			for _, m := range [][]byte{good, bad.wire()} {
				batch = protowire.AppendBytes(protowire.AppendTag(batch, 1, protowire.BytesType), m)
			}
			err = conn.Invoke(ctx, rationv1.RateLimiter_AllowBatch_FullMethodName, &batch, &out, raw)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "requests[1]."+tt.grpcField) {
				t.Errorf("AllowBatch = %v, want INVALID_ARGUMENT naming requests[1].%s", err, tt.grpcField)
			}

			st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true},
				rationv1.RateLimiter_AllowStream_FullMethodName, raw)
			if err != nil {
				t.Fatal(err)
			}
			after := rawAllow{desc: []string{"tenant", u + "-stream"}}.wire()
			for _, m := range [][]byte{bad.wire(), after} {
				if err := st.SendMsg(&m); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.CloseSend(); err != nil {
				t.Fatal(err)
			}
			var answers []*rationv1.AllowResponse
			for range 2 {
				var b []byte
				if err := st.RecvMsg(&b); err != nil {
					t.Fatalf("AllowStream: %v", err)
				}
				r := new(rationv1.AllowResponse)
				if err := proto.Unmarshal(b, r); err != nil {
					t.Fatal(err)
				}
				answers = append(answers, r)
			}
			if r := answers[0]; r.Reason != rationv1.Reason_REASON_INVALID || !strings.Contains(r.Error, tt.grpcField) {
				t.Errorf("AllowStream's answer to the bad request = %v, want REASON_INVALID naming %s", r, tt.grpcField)
			}
			if r := answers[1]; !r.Allowed {
				t.Errorf("AllowStream's next answer = %v, want the stream going on", r)
			}

			code, msg := a.httpDo(t, "POST", "/v1/allow", bad.json())
			var e struct {
				Error string `json:"error"`
			}
			if json.Unmarshal([]byte(msg), &e) != nil || code != 400 || !strings.Contains(e.Error, tt.httpField) {
				t.Errorf("POST /v1/allow %q = %d %s, want 400 naming %s", bad.json(), code, msg, tt.httpField)
			}

			// Allow, AllowBatch, AllowStream's request, POST /v1/allow.
			if n := metricValue(t, a.srv.Registry, "ration_requests_invalid_total", nil) - invalidBefore; n != 4 {
				t.Errorf("ration_requests_invalid_total rose by %v, want 4 (each refusal once)", n)
			}
			a.fullBurst(t, u, probe)
			a.fullBurst(t, u+"-batch", nil)
		})
	}
}

// Envoy's ShouldRateLimit answers a string that is not UTF-8 as the
// agent's own API does: INVALID_ARGUMENT, counted once as invalid, and
// nothing charged; the connection goes on serving. Before, protobuf's
// reader failed the call as INTERNAL.
func TestEnvoyInvalidUTF8IsInvalidArgument(t *testing.T) {
	a := startAgent(t, strictRules)
	conn, err := grpc.NewClient(a.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	raw := grpc.ForceCodec(rawCodec{})
	// RateLimitRequest{domain: 1, descriptors: 2 {entries: 1 {key: 1, value: 2}}}.
	rls := func(domain, key, value string) []byte {
		entry := appendStr(appendStr(nil, 1, key), 2, value)
		desc := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), entry)
		return protowire.AppendBytes(protowire.AppendTag(appendStr(nil, 1, domain), 2, protowire.BytesType), desc)
	}
	const method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct{ name, domain, key, value string }{
		{"domain", "ration\xff", "user", "e1"},
		{"descriptor key", "ration", "user\xfe", "e2"},
		{"descriptor value", "ration", "user", "e3\xc3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := metricValue(t, a.srv.Registry, "ration_requests_invalid_total", nil)
			in, out := rls(tc.domain, tc.key, tc.value), []byte(nil)
			err := conn.Invoke(ctx, method, &in, &out, raw)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "UTF-8") {
				t.Fatalf("ShouldRateLimit with a %s not UTF-8 = %v, want INVALID_ARGUMENT naming UTF-8", tc.name, err)
			}
			if got := metricValue(t, a.srv.Registry, "ration_requests_invalid_total", nil) - before; got != 1 {
				t.Fatalf("ration_requests_invalid_total rose by %v, want 1", got)
			}
			// The same connection still decides a good request.
			good := rls("ration", "user", "e-good")
			if err := conn.Invoke(ctx, method, &good, &out, raw); err != nil {
				t.Fatalf("a good ShouldRateLimit after the bad one: %v", err)
			}
		})
	}
}

// TestRLQSInvalidUTF8IsInvalidArgument: an RLQS usage report whose domain
// or bucket id key or value is not UTF-8 (raw bytes, as a client not
// built on Go's protobuf can send them), through a real agent's gRPC
// server and codec, ends the stream INVALID_ARGUMENT naming the report
// entry and the key, as rlqs refuses any invalid report: counted in
// ration_rlqs_refused_total{reason="invalid"}, no action sent, no bucket
// kept. It used to end INTERNAL "grpc: failed to unmarshal the received
// message", naming nothing, counted nowhere. The connection goes on.
func TestRLQSInvalidUTF8IsInvalidArgument(t *testing.T) {
	a := startAgent(t, strictRules)
	conn, err := grpc.NewClient(a.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// RateLimitQuotaUsageReports{domain: 1, bucket_quota_usages: 2
	// {bucket_id: 1 {bucket: 1 {entry}}, num_requests_allowed: 3}}.
	report := func(domain string, entry []byte) []byte {
		id := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), entry)
		u := protowire.AppendVarint(protowire.AppendTag(protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), id), 3, protowire.VarintType), 1)
		return protowire.AppendBytes(protowire.AppendTag(appendStr(nil, 1, domain), 2, protowire.BytesType), u)
	}
	kv := func(k, v string) []byte { return appendStr(appendStr(nil, 1, k), 2, v) }
	const method = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
	one := func(ctx context.Context, in []byte) error {
		s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method, grpc.ForceCodec(rawCodec{}))
		if err != nil {
			return err
		}
		if err := s.SendMsg(&in); err != nil {
			return err
		}
		var out []byte
		return s.RecvMsg(&out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sent := func() float64 { return metricSum(t, a.srv.Registry, "ration_rlqs_assignments_total", nil) }
	refused := func() float64 {
		return metricSum(t, a.srv.Registry, "ration_rlqs_refused_total", map[string]string{"reason": "invalid"})
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"bucket id value", report("edge", kv("tenant", "\xff\xfe")), `bucket_quota_usages[0]: bucket_id: invalid descriptors: key "tenant": value is not valid UTF-8`},
		{"bucket id key", report("edge", kv("ten\xc3ant", "acme")), `bucket_quota_usages[0]: bucket_id: invalid descriptors: key "ten\xc3ant": key is not valid UTF-8`},
		// An entry's value before its key: the key is still named.
		{"value before its key", report("edge", append(appendStr(nil, 2, "\xed\xa0\x80"), appendStr(nil, 1, "tenant")...)), `key "tenant": value is not valid UTF-8`},
		{"domain", report("ed\x80ge", kv("tenant", "acme")), "domain is not valid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, sentBefore := refused(), sent()
			err := one(ctx, tc.in)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("a report with a %s not UTF-8: %v; want INVALID_ARGUMENT naming %q", tc.name, err, tc.want)
			}
			if got := refused() - before; got != 1 {
				t.Errorf(`ration_rlqs_refused_total{reason="invalid"} rose by %v, want 1`, got)
			}
			if got := sent() - sentBefore; got != 0 {
				t.Errorf("%v actions sent for a refused report", got)
			}
			waitFor(t, "no RLQS stream or bucket left", func() bool {
				return metricValue(t, a.srv.Registry, "ration_rlqs_streams", nil) == 0 && metricValue(t, a.srv.Registry, "ration_rlqs_active_buckets", nil) == 0
			})
		})
	}
	// The same connection: a good report is answered.
	if err := one(ctx, report("edge", kv("tenant", "acme"))); err != nil {
		t.Fatalf("a good report after the bad ones: %v", err)
	}
}
