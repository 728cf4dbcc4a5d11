// Package header is the client module's copy of the root module's
// internal/header, which owns the HTTP response fields that tell a client
// about its quota: Retry-After (RFC 9110, whole seconds rounded up) and the
// IETF draft-ietf-httpapi-ratelimit-headers-11 RateLimit-Policy and
// RateLimit fields. The client module cannot import the root module's
// packages (its importers would inherit the root's dependencies), so
// Middleware writes the fields through this copy; header.go and list.go are
// the root's files byte for byte, which the root's TestClientCopy checks,
// so that Middleware, the agent's check endpoint and its Envoy service
// write the same fields.
package header
