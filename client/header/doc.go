// Package header owns the HTTP response fields that tell a client about its
// quota: Retry-After (RFC 9110, whole seconds rounded up) and the IETF
// draft-ietf-httpapi-ratelimit-headers-11 RateLimit-Policy and RateLimit
// fields. Every surface of Ration (the agent's check endpoint, the headers
// Envoy adds from its rate-limit service, and this module's Middleware)
// writes them with this package's code: Set for one quota on an
// http.Header, Fields for several quotas as name/value pairs, Unavailable
// for a 503 from a limiter that could not decide. ParsePolicy and
// ParseRateLimit read the fields back (RFC 9651 lists): a caller behind a
// Ration-limited service can read what a response says of its quota, and
// the tests check every surface with them, and them with the draft's own
// examples.
//
// It lives in the client module, which needs nothing beyond the standard
// library for it, so that the agent (in the root module, which requires
// this one) and Middleware share one copy of the code.
package header
