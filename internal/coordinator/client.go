package coordinator

import "github.com/ration-dev/ration/internal/coordclient"

// The client of a coordinator group lives in internal/coordclient, so that
// agents link no Raft and no BoltDB. These names stay for the
// coordinator's own calls to other groups (-join, a regional group's
// -upstream) and for tests written against them.

// LeaderTrailer is the gRPC trailer in which a node that cannot serve
// (a follower, or a leader not yet ready) names the leader's gRPC address.
// It is empty when the node knows no leader.
const LeaderTrailer = coordclient.LeaderTrailer

// Client is coordclient.Client.
type Client = coordclient.Client

// ClientOptions is coordclient.Options.
type ClientOptions = coordclient.Options

// NewClient is coordclient.New.
func NewClient(addrs []string, opts ClientOptions) *Client { return coordclient.New(addrs, opts) }
