// Package header owns the HTTP response fields that tell a client about its
// quota: Retry-After (RFC 9110, whole seconds rounded up) and the IETF
// draft-ietf-httpapi-ratelimit-headers-11 RateLimit-Policy and RateLimit
// fields. Every HTTP surface of Ration (the check endpoint, middleware,
// Envoy headers) sets them through this one package.
package header
