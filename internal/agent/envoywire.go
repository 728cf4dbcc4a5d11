package agent

import (
	"context"
	"errors"
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

// rlsWire is Envoy's ShouldRateLimit request as the codec reads it: the
// message, or why the caller's bytes are not one the agent takes. A string
// that is not UTF-8 is the caller's bad input (INVALID_ARGUMENT, as the
// agent's own API and HTTP answer the same bytes), not a message gRPC
// failed to read (INTERNAL).
type rlsWire struct {
	req     rlsv3.RateLimitRequest
	invalid error
}

// unmarshalRLS reads data into w with protobuf, keeping a UTF-8 error for
// the handler.
func (c codec) unmarshalRLS(data mem.BufferSlice, w *rlsWire) error {
	w.invalid = nil
	err := c.CodecV2.Unmarshal(data, &w.req)
	var u interface{ InvalidUTF8() bool }
	if err != nil && errors.As(err, &u) && u.InvalidUTF8() {
		w.invalid = fmt.Errorf("%w: RateLimitRequest: a string (the domain, or a descriptor entry's key or value) is not valid UTF-8", ErrInvalidRequest)
		return nil
	}
	return err
}

// envoyServiceDesc is rlsv3's service with ShouldRateLimit's request read
// as an rlsWire.
func envoyServiceDesc() *grpc.ServiceDesc {
	desc := rlsv3.RateLimitService_ServiceDesc
	desc.Methods = append([]grpc.MethodDesc(nil), desc.Methods...)
	for i := range desc.Methods {
		if desc.Methods[i].MethodName == "ShouldRateLimit" {
			desc.Methods[i].Handler = shouldRateLimitHandler
		}
	}
	return &desc
}

func shouldRateLimitHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(rlsWire)
	if err := dec(in); err != nil {
		return nil, err
	}
	e := srv.(*envoyServer)
	answer := func(ctx context.Context, w *rlsWire) (any, error) {
		if w.invalid != nil {
			e.svc.metrics.invalid.Inc()
			return nil, status.Error(codes.InvalidArgument, w.invalid.Error())
		}
		return e.ShouldRateLimit(ctx, &w.req)
	}
	return intercept(ctx, srv, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, in, interceptor, answer)
}
