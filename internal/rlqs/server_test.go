package rlqs

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ration-dev/ration/internal/rules"
)

type staticRules struct{ s *rules.Set }

func (r staticRules) Current() *rules.Set { return r.s }

func serve(t *testing.T, o Options) rlqsv3.RateLimitQuotaServiceClient {
	t.Helper()
	_, c := serveOn(t, New(o))
	return c
}

// serveOn serves srv on a real socket and returns its gRPC server and a
// client of it, dialed with opts.
func serveOn(t *testing.T, srv *Server, opts ...grpc.DialOption) (*grpc.Server, rlqsv3.RateLimitQuotaServiceClient) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	srv.Register(g)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return g, rlqsv3.NewRateLimitQuotaServiceClient(conn)
}

// entries is a bucket id of n entries, one of them hot (the rule's).
func entries(n int) map[string]string {
	id := map[string]string{"hot": "a"}
	for i := 1; i < n; i++ {
		id[fmt.Sprintf("k%02d", i)] = "v"
	}
	return id
}

func use(id map[string]string, allowed, denied uint64) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: id}, NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

// Hostile or broken reports end the stream with InvalidArgument naming
// the problem, counted as refused (invalid), and nothing of them is
// answered; bounds on buckets end it with ResourceExhausted.
func TestInvalidReportsRefused(t *testing.T) {
	set, err := rules.Parse("r.yaml", []byte("rules:\n  - name: hot\n    match: {hot: \"*\"}\n    burst: 10\n    rate: 10\n    mode: leased\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv := New(Options{Rules: staticRules{set}, MaxBuckets: 3})
	_, c := serveOn(t, srv)
	ok := map[string]string{"hot": "a"}
	refused := func() float64 { return testutil.ToFloat64(srv.m.refused.WithLabelValues("invalid")) }
	sent := func() float64 {
		n := 0.0
		for _, k := range []string{"token_bucket", "allow_all", "deny_all", "abandon"} {
			n += testutil.ToFloat64(srv.m.assignments.WithLabelValues(k))
		}
		return n
	}
	tests := []struct {
		name string
		rep  *rlqsv3.RateLimitQuotaUsageReports
		code codes.Code
		want string
	}{
		{"no domain", &rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{use(ok, 1, 0)}}, codes.InvalidArgument, "no domain"},
		{"empty bucket id", &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{use(nil, 1, 0)}}, codes.InvalidArgument, "empty bucket_id"},
		{"huge value", &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{use(map[string]string{"hot": strings.Repeat("x", 100000)}, 1, 0)}}, codes.InvalidArgument, "bucket_id"},
		{"domain entry", &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{use(map[string]string{"domain": "e"}, 1, 0)}}, codes.InvalidArgument, "conflicts"},
		{"absurd count", &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{use(ok, 1<<62, 0)}}, codes.InvalidArgument, "at most"},
		{"negative elapsed", &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{BucketId: &rlqsv3.BucketId{Bucket: ok}, TimeElapsed: durationpb.New(-1)}}}, codes.InvalidArgument, "time_elapsed"},
		{"too many buckets", &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			use(map[string]string{"hot": "a"}, 1, 0), use(map[string]string{"hot": "b"}, 1, 0), use(map[string]string{"hot": "c"}, 1, 0), use(map[string]string{"hot": "d"}, 1, 0)}}, codes.InvalidArgument, "at most 3"},
		// The domain is one of a bucket's 64 descriptors, as in RLS.
		{"64 entries and the domain", &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			use(entries(rules.MaxDescriptors), 1, 0)}}, codes.InvalidArgument, "bucket_quota_usages[0]: bucket_id: 64 entries besides the domain, at most 63"},
		// Envoy names a bucket once a report: twice would count it, and
		// answer it, twice.
		{"same bucket twice", &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			use(ok, 1, 0), use(map[string]string{"hot": "b"}, 1, 0), use(map[string]string{"hot": "a"}, 2, 0)}}, codes.InvalidArgument, "bucket_quota_usages[0] and [2]: the same bucket_id, a duplicate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := c.StreamRateLimitQuotas(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			before, sentBefore := refused(), sent()
			if err := s.Send(tt.rep); err != nil {
				t.Fatal(err)
			}
			resp, err := s.Recv()
			if status.Code(err) != tt.code || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, %v; want %v naming %q", resp, err, tt.code, tt.want)
			}
			if got := refused() - before; tt.code == codes.InvalidArgument && got != 1 {
				t.Errorf("ration_rlqs_refused_total{reason=\"invalid\"} rose by %v, want 1", got)
			}
			if got := sent() - sentBefore; got != 0 {
				t.Errorf("%v actions sent for a refused report", got)
			}
		})
	}
	// At the limit: 63 entries and the domain, or 64 of which one is the
	// domain itself.
	named := entries(rules.MaxDescriptors - 1)
	named["domain"] = "d"
	for _, id := range []map[string]string{entries(rules.MaxDescriptors - 1), named} {
		s, err := c.StreamRateLimitQuotas(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{use(id, 1, 0)}}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatalf("a bucket id of %d entries, the domain %s: %v", len(id), map[bool]string{true: "among them", false: "besides"}[id["domain"] != ""], err)
		}
	}
	// A report naming one new bucket twice, on a stream one bucket short
	// of MaxBuckets: refused as a duplicate, not counted as two buckets
	// (ResourceExhausted), and nothing of it answered.
	dup, err := c.StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"a", "b"} {
		if err := dup.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{use(map[string]string{"hot": v}, 1, 0)}}); err != nil {
			t.Fatal(err)
		}
		if _, err := dup.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	c2 := map[string]string{"hot": "c"}
	sentBefore := sent()
	if err := dup.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{use(c2, 1, 0), use(c2, 1, 0)}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := dup.Recv(); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "bucket_quota_usages[0] and [1]") {
		t.Fatalf("one new bucket named twice beside 2 of at most 3: got %v, %v; want InvalidArgument naming bucket_quota_usages[0] and [1]", resp, err)
	}
	if got := sent() - sentBefore; got != 0 {
		t.Errorf("%v actions sent for a refused report", got)
	}
	// Buckets over several reports: the fourth is refused.
	s, err := c.StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range []string{"a", "b", "c", "d"} {
		if err := s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{use(map[string]string{"hot": v}, 1, 0)}}); err != nil {
			t.Fatal(err)
		}
		resp, err := s.Recv()
		if i < 3 {
			// No lease holder: the leased rule's failure policy
			// (fail_closed) is the assignment.
			if err != nil || kindOf(resp.GetBucketAction()[0]) != "deny_all" {
				t.Fatalf("bucket %s: %v, %v; want deny_all", v, resp, err)
			}
			continue
		}
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("fourth bucket: %v, %v; want ResourceExhausted", resp, err)
		}
	}
}

// A bucket that matches a rule RLQS cannot enforce (here: a rule it would
// take for, with no decision path to take from) gets the rule's failure
// policy, and the operator is told once, with the rule's name and why,
// however many buckets and reports match it: an admitting policy
// (fail_open) limits nothing on Envoy. A shadow rule never denies and is
// no warning's business.
func TestUnenforcedRuleWarnedOnce(t *testing.T) {
	tests := []struct {
		name, rule string
		kind       string
		warned     bool
	}{
		{"fail_open admits", "    on_failure: fail_open\n", "allow_all", true},
		{"fail_closed denies", "    on_failure: fail_closed\n", "deny_all", true},
		{"shadow", "    shadow: true\n", "allow_all", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, err := rules.Parse("rules.yaml", []byte("rules:\n  - name: per-user\n    match: {user: \"*\"}\n    burst: 10\n    rate: 1\n"+tt.rule))
			if err != nil {
				t.Fatal(err)
			}
			var logs syncBuffer
			c := serve(t, Options{Rules: staticRules{set}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			s, err := c.StreamRateLimitQuotas(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, u := range []string{"a", "b", "a"} {
				if err := s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{use(map[string]string{"user": u}, 1, 0)}}); err != nil {
					t.Fatal(err)
				}
				resp, err := s.Recv()
				if err != nil || kindOf(resp.GetBucketAction()[0]) != tt.kind {
					t.Fatalf("user %s: %v, %v; want %s", u, resp, err, tt.kind)
				}
			}
			out := logs.String()
			n := strings.Count(out, "cannot enforce")
			if !tt.warned {
				if n != 0 {
					t.Fatalf("a shadow rule was warned about:\n%s", out)
				}
				return
			}
			if n != 1 || !strings.Contains(out, "rule=per-user") || !strings.Contains(out, "no decision path") {
				t.Fatalf("want one warning naming rule per-user and why, got %d in:\n%s", n, out)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer the server's goroutines may write to while
// the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
