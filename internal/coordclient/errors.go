package coordclient

import "errors"

// Errors a Client returns besides the gRPC status of the last attempt (or
// the caller's context error). internal/coordinator's ErrStopped and
// ErrInvalidRequest are these values, so errors.Is matches either name.
var (
	// ErrStopped: the Client was closed.
	ErrStopped = errors.New("coordinator stopped")
	// ErrInvalidRequest: the call could not be sent as asked (no
	// addresses, or an address gRPC cannot parse). Nothing was sent.
	ErrInvalidRequest = errors.New("invalid request")
)
