// Package agent owns the gateway-agent service: it turns a request's
// descriptors into the matching rules' bucket charges, decides on the Redis
// path (one pipelined round trip for all of a request's rules), on the lease
// path (local, no I/O), or through the rule's failure policy when the store
// is unreachable, and serves that decision over gRPC and HTTP with metrics,
// health and rule reloading.
//
// A request is admitted only if every matching rule admits; tokens taken by
// the rules that admitted are refunded when a later one denies. Shadow rules
// are charged and counted like others but never deny.
//
// The decision side (rules and their reload, store, lease holder, Service)
// is a Core, built by NewCore; Start puts the sidecar's listeners in front
// of one, and the public package limiter decides with one inside a Go
// process.
package agent
