package rlqs

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// smallWindows keeps a client connection's flow-control windows at
// 64KiB (no growth): a stream its caller never reads stalls the server's
// Send once about 128KiB of responses are unread.
var smallWindows = []grpc.DialOption{grpc.WithInitialWindowSize(65535), grpc.WithInitialConnWindowSize(65535)}

// fatReport names n new buckets, from, each id of 60 entries of 250
// bytes: each action for one echoes 15KB.
func fatReport(from, n int) *rlqsv3.RateLimitQuotaUsageReports {
	rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge"}
	for i := from; i < from+n; i++ {
		rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, use(padded(i, 60), 1, 0))
	}
	return rep
}

// waitUntil polls cond every 10ms, at most for d (a bound far above what
// is waited for, not a timing assertion).
func waitUntil(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// A client that sends reports but never reads the answers would block its
// stream's handler in Send for as long as its connection stays open: no
// timer of the stream runs, no bucket of it is abandoned, no reservation
// settles. The handler gives up after SendTimeout and ends the stream.
func TestUnreadStreamEnded(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := New(Options{SendTimeout: 300 * time.Millisecond, Registry: reg})
	_, c := serveOn(t, s, smallWindows...)
	st, err := c.StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// 3 reports of 8 buckets: about 360KB of answers, never read.
	for r := range 3 {
		if err := st.Send(fatReport(r*8, 8)); err != nil {
			t.Fatal(err)
		}
	}
	if !waitUntil(20*time.Second, func() bool { return s.streams.Load() == 0 }) {
		t.Fatalf("a stream whose answers go unread is still open (%d streams): its handler is blocked in Send", s.streams.Load())
	}
	if n := testutil.ToFloat64(s.m.refused.WithLabelValues("unread")); n != 1 {
		t.Fatalf("ration_rlqs_refused_total{reason=unread} = %v, want 1", n)
	}
	// The client, reading at last, finds its stream ended as unread.
	for range 100 {
		if _, err := st.Recv(); err != nil {
			if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "unread") {
				t.Fatalf("stream ended with %v, want DeadlineExceeded naming the unread responses", err)
			}
			return
		}
	}
	t.Fatal("the stream answered 100 responses and did not end")
}

// Stop ends every open stream with Unavailable, and refuses new ones: a
// graceful stop of the gRPC server does not wait on Envoys.
func TestStopEndsStreams(t *testing.T) {
	// Nothing else ends the stream within the test's bound (20s): no
	// bucket is abandoned.
	s := New(Options{AbandonAfter: time.Hour})
	g, c := serveOn(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{use(map[string]string{"a": "b"}, 1, 0)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("open stream after Stop: %v, want Unavailable", err)
	}
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("GracefulStop still waits after Stop ended the streams")
	}
}

// padded is a bucket id of n entries of 250 bytes, distinct by i.
func padded(i, n int) map[string]string {
	id := map[string]string{}
	for k := range n {
		id[fmt.Sprintf("pad%d", k)] = fmt.Sprintf("%04d%s", i, strings.Repeat("p", 246))
	}
	return id
}

// What the bucket ids of all streams hold is bounded: a report whose new
// buckets would pass MaxBucketBytes is refused with ResourceExhausted,
// and a bucket gives its bytes back when its stream ends or it is
// abandoned (a leak would end by refusing every bucket).
func TestBucketIDBytesBounded(t *testing.T) {
	one := idBytes(padded(0, 10)) + 2*int64(len("domain")+len("edge")) + 64
	s := New(Options{MaxBucketBytes: one + one/2, AbandonAfter: 500 * time.Millisecond, Tick: 50 * time.Millisecond})
	_, c := serveOn(t, s)
	report := func(ctx context.Context, i int) (rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, error) {
		st, err := c.StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{use(padded(i, 10), 1, 0)}}); err != nil {
			t.Fatal(err)
		}
		_, err = st.Recv()
		return st, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := report(ctx, 1); err != nil {
		t.Fatalf("first bucket: %v", err)
	}
	if got := s.idBytes.Load(); got != one {
		t.Fatalf("one bucket counted as %d bytes, want %d", got, one)
	}
	if _, err := report(context.Background(), 2); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "bytes") {
		t.Fatalf("a second bucket past the bound: %v, want ResourceExhausted naming the bytes", err)
	}
	cancel() // the first stream ends: its bucket's bytes come back
	if !waitUntil(20*time.Second, func() bool { return s.idBytes.Load() == 0 }) {
		t.Fatalf("%d bytes still counted after the only stream ended", s.idBytes.Load())
	}
	// A bucket that reports no request is abandoned after 500ms: its
	// bytes come back with the stream still open.
	st, err := report(context.Background(), 3)
	if err != nil {
		t.Fatalf("a bucket after the first stream ended: %v", err)
	}
	if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{use(padded(3, 10), 0, 0)}}); err != nil {
		t.Fatal(err)
	}
	if !waitUntil(20*time.Second, func() bool { return s.idBytes.Load() == 0 }) {
		t.Fatalf("%d bytes still counted after the only bucket was abandoned", s.idBytes.Load())
	}
}
