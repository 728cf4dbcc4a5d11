// Package grpcsafe holds the server options every Ration gRPC server uses:
// a panic in a handler answers that call with codes.Internal and is
// logged with its stack (grpc-go does not recover handler panics: one bad
// request would otherwise end the process and every decision with it);
// keepalive enforcement, so a client cannot hold connections open with
// pings alone; and bounds on what one connection may make the server hold
// (streams in flight, the size of one message, an idle connection's life).
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

const (
	// MaxRecvMsgSize bounds one message a server reads: a larger one is
	// refused with RESOURCE_EXHAUSTED before it is decoded. It is above
	// the largest request either server accepts whole:
	//
	//   - a coordinator Renew or Release of lease.MaxItems (10,000) items,
	//     every name at lease.MaxNameLen and every field set: 5.8 MB (the
	//     agents' holders split theirs at 1 MiB);
	//   - an Envoy ShouldRateLimit of 64 descriptors, every entry and the
	//     domain at their limits: 2.1 MB;
	//   - one Allow or AllowStream message at every limit: 34 KB.
	//
	// An AllowBatch of agent.MaxBatch (10,000) requests fits when they
	// average under 830 bytes (a request of a few descriptors is about
	// 100); a batch of that many requests each at every limit would be
	// 338 MB, more than an agent's memory, and gRPC's default bound
	// (4 MiB), in force until this one, refused it too: such a batch is
	// split by its caller, as one of over MaxBatch requests is.
	MaxRecvMsgSize = 8 << 20
	// MaxConcurrentStreams bounds the calls in flight on one connection
	// (gRPC's default: no bound, a goroutine and buffers for each). A
	// gRPC client waits for a slot rather than fail; Envoy opens another
	// connection. ration-bench holds one AllowStream per worker over -conns
	// connections (default 4), so runs of more than 1000 stream workers per
	// connection need more -conns.
	MaxConcurrentStreams = 1000
	// MaxConnectionIdle closes (GOAWAY) a connection with no call in flight
	// for this long; a client reconnects at its next call. Connections
	// that carry decisions or a lease watch are never idle that long;
	// abandoned ones stop holding a slot. A peer that vanished is found
	// by the kernel's TCP keepalive, which Go turns on for every accepted
	// connection, so no server pings are set.
	MaxConnectionIdle = 5 * time.Minute
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
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: MaxConnectionIdle}),
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
	}
}

// UnaryRecover turns a handler panic into codes.Internal for that call.
func UnaryRecover(logger *slog.Logger, panicked func()) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = Recovered(logger, panicked, info.FullMethod, r)
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
				err = Recovered(logger, panicked, info.FullMethod, r)
			}
		}()
		return handler(srv, ss)
	}
}

// Recovered logs and counts a panic recovered while serving method and
// returns the status its caller gets. For the goroutines a stream handler
// starts, which the interceptors do not cover.
func Recovered(logger *slog.Logger, panicked func(), method string, r any) error {
	if logger != nil {
		logger.Error("panic in gRPC handler", "method", method, "panic", r, "stack", string(debug.Stack()))
	}
	if panicked != nil {
		panicked()
	}
	return status.Errorf(codes.Internal, "internal error in %s", method)
}
