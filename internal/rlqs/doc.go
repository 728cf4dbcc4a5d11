// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3, RLQS) on the gateway-agent: Envoy
// reports each bucket's usage on a stream, and the agent answers with
// assignments (token buckets, ALLOW_ALL, DENY_ALL, abandon) that Envoy
// enforces on its own until their TTL ends.
//
// A bucket id maps to rules exactly as an RLS descriptor does (its entries,
// plus "domain" set to the stream's domain). A leased rule's assignment is
// funded by lending its size from the agent's lease of the rule and subject
// before it is sent (tab.go has the accounting and its argument); what
// Envoy reports drives the lease's demand. Any other rule's (mode redis,
// mode auto, lease.default_share) is funded by taking everything Envoy
// could spend under it through the agent's own decision path before it is
// sent (take.go).
//
// Files: tab.go (the lent accounting), take.go (takes and their
// argument), server.go (the service, streams and bounds), clients.go
// (streams per client connection, and ending silent ones), send.go
// (responses sent off the handler's goroutine, an unread stream ended),
// renew.go (lent assignments sent again before they lapse at Envoy),
// validate.go (reports checked before use), assign.go (a bucket's action
// from the rules it matches, lending, and failure policies), plan.go and
// share.go (sizing an assignment from a lease and the bucket's share of
// demand), ledger.go (the rate lent, integrated), metrics.go.
package rlqs
