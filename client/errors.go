package client

import "errors"

// Errors returned by Client.Allow and AllowBatch; test with errors.Is.
var (
	// ErrInvalid marks a request the agent rejected as malformed (bad cost,
	// descriptors, rule or request id). It never succeeds as sent, and no
	// bucket was touched.
	ErrInvalid = errors.New("ration: invalid request")
	// ErrUnavailable marks a call that got no decision: the agent could not
	// be reached, or did not answer within the deadline. What to do then is
	// the caller's policy (Middleware: FailOpen).
	ErrUnavailable = errors.New("ration: agent unavailable")
)
