package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// MaxBatch bounds one AllowBatch call; larger batches are split by callers.
const MaxBatch = 10000

// grpcServer adapts Service to ration.v1.RateLimiter.
type grpcServer struct {
	rationv1.UnimplementedRateLimiterServer
	svc *Service
}

var _ rationv1.RateLimiterServer = (*grpcServer)(nil)

func fromProto(r *rationv1.AllowRequest) Request {
	return Request{
		Descriptors: r.GetDescriptors(),
		Rule:        r.GetRule(),
		Subject:     r.GetSubject(),
		Cost:        r.GetCost(),
		RequestID:   r.GetRequestId(),
	}
}

func toProto(resp Response, dst *rationv1.AllowResponse) {
	dst.Allowed = resp.Allowed
	dst.RetryAfterMs = ceilMillis(resp.RetryAfter)
	dst.Remaining = floorInt(resp.Remaining)
	dst.Limit = floorInt(resp.Limit)
	dst.Rate = resp.Rate
	dst.ResetMs = ceilMillis(resp.Reset)
	dst.Rule = resp.Rule
	dst.Reason = reasonProto[resp.Reason]
}

var reasonProto = [...]rationv1.Reason{
	rationv1.Reason_REASON_UNSPECIFIED,
	ReasonOK:          rationv1.Reason_REASON_OK,
	ReasonOverLimit:   rationv1.Reason_REASON_OVER_LIMIT,
	ReasonNoRule:      rationv1.Reason_REASON_NO_RULE,
	ReasonShadow:      rationv1.Reason_REASON_SHADOW,
	ReasonUnavailable: rationv1.Reason_REASON_UNAVAILABLE,
	ReasonEmergency:   rationv1.Reason_REASON_EMERGENCY,
}

func (g *grpcServer) Allow(ctx context.Context, r *rationv1.AllowRequest) (*rationv1.AllowResponse, error) {
	resp, err := g.svc.Decide(ctx, fromProto(r))
	if err != nil {
		return nil, grpcError(err)
	}
	out := &rationv1.AllowResponse{}
	toProto(resp, out)
	return out, nil
}

func (g *grpcServer) AllowBatch(ctx context.Context, r *rationv1.AllowBatchRequest) (*rationv1.AllowBatchResponse, error) {
	n := len(r.GetRequests())
	if n > MaxBatch {
		return g.allowBatch(ctx, nil, n)
	}
	reqs := make([]Request, n)
	for i, pr := range r.GetRequests() {
		reqs[i] = fromProto(pr)
	}
	return g.allowBatch(ctx, reqs, n)
}

// allowBatch answers AllowBatch's requests, however they were decoded (the
// server reads them with decodeBatch, wire.go); n counts them all, reqs
// may hold only the first MaxBatch.
func (g *grpcServer) allowBatch(ctx context.Context, reqs []Request, n int) (*rationv1.AllowBatchResponse, error) {
	d, err := g.decideBatch(ctx, reqs, n)
	if err != nil {
		return nil, err
	}
	defer d.release()
	out := &rationv1.AllowBatchResponse{Responses: make([]*rationv1.AllowResponse, n)}
	backing := make([]rationv1.AllowResponse, n)
	for i := range d.resps {
		pr := &backing[i]
		if d.errs[i] != nil {
			pr.Reason = rationv1.Reason_REASON_INVALID
			pr.Error = d.errs[i].Error()
		} else {
			toProto(d.resps[i], pr)
		}
		out.Responses[i] = pr
	}
	return out, nil
}

// decideBatch decides AllowBatch's requests into pooled answers. The
// server's handler gives them to the codec as they are, which writes them
// to the wire (appendDecided, wire.go) and releases them: a message per
// answer was a tenth of a leased batch's CPU, with the garbage it left.
func (g *grpcServer) decideBatch(ctx context.Context, reqs []Request, n int) (*decided, error) {
	if n > MaxBatch {
		return nil, status.Errorf(codes.InvalidArgument, "batch of %d requests: at most %d", n, MaxBatch)
	}
	if len(reqs) != n {
		return nil, status.Errorf(codes.Internal, "agent: %d of the batch's %d requests decoded", len(reqs), n)
	}
	d := getDecided(n)
	g.svc.DecideBatch(ctx, reqs, d.resps, d.errs)
	return d, nil
}

// decided holds a batch's answers until they are written into its reply.
type decided struct {
	resps []Response
	errs  []error
}

var decidedPool sync.Pool // of *decided

// release gives d back once its answers are written. The errors are
// cleared (they may hold a request's strings); the responses are written
// over in full by the next DecideBatch.
func (d *decided) release() {
	if cap(d.resps) > 4*MaxBatch {
		return
	}
	clear(d.errs)
	decidedPool.Put(d)
}

// getDecided returns room for n answers; DecideBatch sets every one.
func getDecided(n int) *decided {
	d, _ := decidedPool.Get().(*decided)
	if d == nil {
		d = &decided{}
	}
	d.resps, d.errs = room(d.resps, n)[:n], room(d.errs, n)[:n]
	return d
}

// AllowStream answers each request in order. Requests are decided one at a
// time per stream; gateways wanting more concurrency open several streams or
// use AllowBatch.
func (g *grpcServer) AllowStream(stream rationv1.RateLimiter_AllowStreamServer) error {
	ctx := stream.Context()
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		out := &rationv1.AllowResponse{}
		resp, derr := g.svc.Decide(ctx, fromProto(r))
		if derr != nil {
			out.Reason = rationv1.Reason_REASON_INVALID
			out.Error = derr.Error()
		} else {
			toProto(resp, out)
		}
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

// grpcError maps agent errors to gRPC codes at the edge.
func grpcError(err error) error {
	switch {
	case errors.Is(err, ErrInvalidRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	default:
		return status.Error(codes.Internal, fmt.Sprintf("agent: %v", err))
	}
}
