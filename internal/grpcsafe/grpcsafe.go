// Package grpcsafe holds the server options every Ration gRPC server uses:
// a panic in a handler answers that call with codes.Internal and is
// logged with its stack (grpc-go does not recover handler panics: one bad
// request would otherwise end the process and every decision with it), and
// keepalive enforcement, so a client cannot hold connections open with
// pings alone.
package grpcsafe

import (
	"context"
	"log/slog"
	"runtime/debug"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// ServerOptions returns the options for a server that logs recovered
// panics to logger and counts them with panicked (nil: not counted).
func ServerOptions(logger *slog.Logger, panicked func()) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(UnaryRecover(logger, panicked)),
		grpc.ChainStreamInterceptor(StreamRecover(logger, panicked)),
		// Clients may ping at most every 10s, also with no call in flight
		// (gRPC's default refuses pings more often than every 5 min and
		// closes the connection of a client that sends them).
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
}

// UnaryRecover turns a handler panic into codes.Internal for that call.
func UnaryRecover(logger *slog.Logger, panicked func()) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = recovered(logger, panicked, info.FullMethod, r)
			}
		}()
		return handler(ctx, req)
	}
}

// StreamRecover turns a handler panic into codes.Internal for that stream.
func StreamRecover(logger *slog.Logger, panicked func()) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = recovered(logger, panicked, info.FullMethod, r)
			}
		}()
		return handler(srv, ss)
	}
}

func recovered(logger *slog.Logger, panicked func(), method string, r any) error {
	if logger != nil {
		logger.Error("panic in gRPC handler", "method", method, "panic", r, "stack", string(debug.Stack()))
	}
	if panicked != nil {
		panicked()
	}
	return status.Errorf(codes.Internal, "internal error in %s", method)
}
