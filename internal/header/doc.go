// Package header owns the HTTP response fields that tell a client about its
// quota: Retry-After (RFC 9110, whole seconds rounded up) and the IETF
// draft-ietf-httpapi-ratelimit-headers-11 RateLimit-Policy and RateLimit
// fields. Every surface of Ration (the check endpoint, the Go middleware,
// the headers Envoy adds from the rate-limit service) writes them with this
// package's code: Set for one quota on an http.Header, Fields for several
// quotas as name/value pairs, Unavailable for a 503 from a limiter that could
// not decide. ParsePolicy and ParseRateLimit read the fields back (RFC 9651
// lists); tests use them to check every surface, and the draft's own
// examples check them.
//
// The Go middleware is in the client module, which cannot import this
// package: it uses client/internal/header, a copy of header.go and list.go
// that TestClientCopy holds byte for byte to these files.
package header
