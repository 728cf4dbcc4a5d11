package agent

import "errors"

// Sentinel errors; the gRPC and HTTP edges map them to status codes.
var (
	// ErrInvalidRequest marks input that can never be decided: bad cost,
	// descriptors, rule or request id. No bucket was touched.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrUnknownRule marks a request naming a rule that is not loaded. It
	// wraps ErrInvalidRequest.
	ErrUnknownRule = errors.New("unknown rule")
)
