package client

import (
	"context"
	"errors"
	"net/http"

	"github.com/ration-dev/ration/client/header"
)

// Allower decides requests. *Client and *Stream implement it, and so does
// the fake of package clienttest, for the tests of code that takes one.
type Allower interface {
	Allow(ctx context.Context, req Request) (Decision, error)
}

var _ Allower = (*Client)(nil)

// DescribeFunc says what to ask the agent about an HTTP request: its
// descriptors (and optionally cost or request id). ok false lets the
// request through unchecked (a health check, an internal caller).
type DescribeFunc func(r *http.Request) (req Request, ok bool)

// MiddlewareOptions configure Middleware.
type MiddlewareOptions struct {
	// FailOpen lets requests through when no decision could be had (the
	// agent is unreachable or too slow). By default they get 503 with
	// Retry-After: 1, as under a fail_closed rule. This is about the agent
	// only: when the agent's own store is down, each rule's on_failure
	// policy has already decided.
	FailOpen bool
	// OnError, when set, is told of every failed call (for logs or
	// metrics), before the response is written.
	OnError func(r *http.Request, err error)
}

// Middleware returns an http.Handler wrapper that asks the agent about
// every request before next sees it:
//
//   - admitted: next serves it; the response carries RateLimit-Policy and
//     RateLimit when a rule applied and a bucket was read;
//   - quota spent: 429 with Retry-After (when a wait can help),
//     RateLimit-Policy and RateLimit; next is not called;
//   - the agent's store unreachable under a fail_closed rule, or the agent
//     itself unreachable (unless FailOpen): 503 with Retry-After: 1;
//   - a request the agent rejects as malformed (say, a descriptor value
//     longer than 256 bytes taken from a header): 400.
//
// The fields are written by the same code as the agent's check endpoint.
func Middleware(c Allower, describe DescribeFunc, opts MiddlewareOptions) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, ok := describe(r)
			if !ok {
				next.ServeHTTP(w, r)
				return
			}
			d, err := c.Allow(r.Context(), req)
			if err != nil {
				if opts.OnError != nil {
					opts.OnError(r, err)
				}
				switch {
				case errors.Is(err, ErrInvalid):
					http.Error(w, "rate limit check: invalid request", http.StatusBadRequest)
				case errors.Is(err, context.Canceled):
					// The client is gone; nobody reads an answer.
					w.WriteHeader(http.StatusServiceUnavailable)
				case opts.FailOpen:
					next.ServeHTTP(w, r)
				default:
					header.Unavailable(w.Header())
					http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
				}
				return
			}
			code := d.Status()
			switch {
			case code == http.StatusServiceUnavailable:
				header.Unavailable(w.Header())
			case d.Rule != "" && d.Reason != ReasonUnavailable:
				// (A fail_open admission read no bucket: no quota to report.)
				header.Set(w.Header(), d.quota())
			}
			switch code {
			case http.StatusOK:
				next.ServeHTTP(w, r)
			case http.StatusTooManyRequests:
				http.Error(w, "rate limit exceeded", code)
			default:
				http.Error(w, "rate limiter unavailable", code)
			}
		})
	}
}

// quota is the deciding rule's state as the header package writes it.
func (d Decision) quota() header.Quota {
	return header.Quota{
		Policy: d.Rule, Limit: float64(d.Limit), Rate: d.Rate,
		Remaining: float64(d.Remaining), Reset: d.Reset, RetryAfter: d.RetryAfter,
	}
}
