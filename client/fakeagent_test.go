package client_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/client"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// fakeAgent serves ration.v1.RateLimiter on loopback with answers the tests
// can predict: every request is admitted with its subject as the rule (so
// a caller can tell its answer from another's), except subject "bad"
// (invalid) and "over" (over_limit). The agent's own behaviour is tested
// against a real agent in the root module (test/goclient).
type fakeAgent struct {
	rationv1.UnimplementedRateLimiterServer
	delay      atomic.Int64 // nanoseconds every unary call and "slow" stream request waits
	batchDelay atomic.Int64 // nanoseconds every AllowBatch waits
	// endAfter, when > 0, ends every stream with UNAVAILABLE when a request
	// arrives after that many answers (an agent restarting).
	endAfter atomic.Int64
	streams  atomic.Int64 // AllowStream calls opened
	unaries  atomic.Int64 // Allow calls answered or failed
	batches  atomic.Int64 // AllowBatch calls answered or failed
	seen     sync.Map     // subject -> *atomic.Int64: requests received (Allow and AllowBatch)
}

// received counts a request of subject.
func (f *fakeAgent) received(subject string) {
	n, _ := f.seen.LoadOrStore(subject, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
}

// receivedOf is how many requests of subject reached the agent.
func (f *fakeAgent) receivedOf(subject string) int64 {
	if n, ok := f.seen.Load(subject); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

func startFake(t *testing.T) (*fakeAgent, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeAgent{}
	srv := grpc.NewServer()
	rationv1.RegisterRateLimiterServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return f, ln.Addr().String()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func answer(r *rationv1.AllowRequest) *rationv1.AllowResponse {
	switch r.GetSubject() {
	case "bad":
		return &rationv1.AllowResponse{Reason: rationv1.Reason_REASON_INVALID, Error: "subject bad"}
	case "over":
		return &rationv1.AllowResponse{Rule: "over", Limit: 5, Rate: 1, RetryAfterMs: 1500, ResetMs: 5000, Reason: rationv1.Reason_REASON_OVER_LIMIT}
	}
	return &rationv1.AllowResponse{Allowed: true, Rule: r.GetSubject(), Limit: 5, Remaining: 4, Rate: 1, ResetMs: 1000, Reason: rationv1.Reason_REASON_OK}
}

func (f *fakeAgent) Allow(ctx context.Context, r *rationv1.AllowRequest) (*rationv1.AllowResponse, error) {
	f.unaries.Add(1)
	f.received(r.GetSubject())
	if err := sleepCtx(ctx, time.Duration(f.delay.Load())); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	if r.GetSubject() == "bad" {
		return nil, status.Error(codes.InvalidArgument, "subject bad")
	}
	return answer(r), nil
}

func (f *fakeAgent) AllowBatch(ctx context.Context, r *rationv1.AllowBatchRequest) (*rationv1.AllowBatchResponse, error) {
	f.batches.Add(1)
	for _, req := range r.GetRequests() {
		f.received(req.GetSubject())
	}
	if err := sleepCtx(ctx, time.Duration(f.batchDelay.Load())); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	out := &rationv1.AllowBatchResponse{}
	for _, req := range r.GetRequests() {
		out.Responses = append(out.Responses, answer(req))
	}
	return out, nil
}

// AllowStream answers in order, one request at a time, as the agent does.
func (f *fakeAgent) AllowStream(st rationv1.RateLimiter_AllowStreamServer) error {
	f.streams.Add(1)
	answered := int64(0)
	for {
		r, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if n := f.endAfter.Load(); n > 0 && answered >= n {
			return status.Error(codes.Unavailable, "agent restarting")
		}
		if r.GetSubject() == "slow" {
			if err := sleepCtx(st.Context(), time.Duration(f.delay.Load())); err != nil {
				return err
			}
		}
		if err := st.Send(answer(r)); err != nil {
			return err
		}
		answered++
	}
}

// req asks rule "r" about subject.
func req(subject string) client.Request {
	return client.Request{Rule: "r", Subject: subject}
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
