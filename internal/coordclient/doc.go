// Package coordclient is the client of a coordinator group's gRPC API
// (ration.v1.Leases, and the membership calls of ration.v1.Admin): it finds
// the leader, follows the "ration-leader" trailer, retries UNAVAILABLE with
// bounded backoff, and keeps the Leases.Watch stream on the leader.
//
// It is a package of its own so that what talks to coordinators links none
// of what runs one: an agent (internal/agent, through its lease holder)
// imports this package and never internal/coordinator, hence neither
// hashicorp/raft nor BoltDB. Only cmd/gateway-agent's -dev wiring starts an
// embedded coordinator. internal/coordinator keeps aliases of these names
// (coordinator.Client, coordinator.NewClient) for its own uses (joining a
// group, a regional group's upstream) and its tests.
package coordclient
