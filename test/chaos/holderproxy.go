package chaos

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/ration-dev/ration/internal/coordinator"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// HolderMerger is a gRPC Leases service in front of each node of a
// coordinator group that rewrites every agent holder name
// "<id>/<incarnation>" to "<id>/merged": the agents behind it look to the
// coordinators like one holder per id, as every agent process did before
// the holder name carried an incarnation. It forwards Renew, Release and
// Watch to its node and rewrites the "ration-leader" trailer from the
// nodes' addresses to their mergers', so a redirect stays behind the
// mergers. It is a test's way to remove the one-holder-per-process
// protection without a knob in the agent.
type HolderMerger struct {
	Addrs []string // one per node, in the nodes' order
}

// mergedIncarnation replaces every incarnation.
const mergedIncarnation = "merged"

// NewHolderMerger serves one merger per node address on free loopback
// ports; everything is stopped in t.Cleanup.
func NewHolderMerger(t testing.TB, nodes []string) *HolderMerger {
	t.Helper()
	return &HolderMerger{Addrs: newLeasesForwarders(t, nodes, nodes, merge)}
}

// NewLeasesForwarders serves one gRPC Leases forwarder per node of a
// group on free loopback ports: forwarder i sends to dial[i] (a fault
// proxy in front of node i) and rewrites the "ration-leader" trailer from
// the nodes' own addresses (named) to the forwarders', so that a client
// redirected to a new leader stays behind the forwarders (and the fault
// proxies) instead of dialing the leader directly. Holder names pass
// unchanged. It returns the forwarders' addresses; they are stopped in
// t.Cleanup.
func NewLeasesForwarders(t testing.TB, dial, named []string) []string {
	t.Helper()
	return newLeasesForwarders(t, dial, named, func(h string) string { return h })
}

func newLeasesForwarders(t testing.TB, dial, named []string, holder func(string) string) []string {
	t.Helper()
	var addrs []string
	var lns []net.Listener
	for range dial {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	// A node's address as a trailer names it -> the forwarder in front of it.
	toMerger := map[string]string{}
	for i, n := range named {
		toMerger[n] = addrs[i]
	}
	for i, n := range dial {
		srv := grpc.NewServer(proxyServerCreds(t))
		rationv1.RegisterLeasesServer(srv, &mergerNode{up: newPassThrough(t, n), toMerger: toMerger, holder: holder})
		go func() { _ = srv.Serve(lns[i]) }()
		t.Cleanup(srv.Stop)
	}
	return addrs
}

type mergerNode struct {
	rationv1.UnimplementedLeasesServer
	up       *passThrough // acts as each caller
	toMerger map[string]string
	holder   func(string) string // rewrites the holder name
}

// merge drops the incarnation of an agent holder name; other names
// (a region's "region/<id>") pass unchanged.
func merge(holder string) string {
	i := strings.LastIndexByte(holder, '/')
	if i <= 0 || strings.HasPrefix(holder, "region/") {
		return holder
	}
	return holder[:i+1] + mergedIncarnation
}

// trailer is tr with the leader's address replaced by its merger's.
func (n *mergerNode) trailer(tr metadata.MD) metadata.MD {
	out := tr.Copy()
	if v := tr.Get(coordinator.LeaderTrailer); len(v) > 0 {
		if m, ok := n.toMerger[v[0]]; ok {
			out.Set(coordinator.LeaderTrailer, m)
		} else {
			out.Set(coordinator.LeaderTrailer, "")
		}
	}
	return out
}

func (n *mergerNode) Renew(ctx context.Context, req *rationv1.RenewRequest) (*rationv1.RenewResponse, error) {
	req.Holder = n.holder(req.Holder)
	var tr metadata.MD
	up, err := n.up.leases(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := up.Renew(ctx, req, grpc.Trailer(&tr))
	_ = grpc.SetTrailer(ctx, n.trailer(tr))
	return resp, err
}

func (n *mergerNode) Release(ctx context.Context, req *rationv1.ReleaseRequest) (*rationv1.ReleaseResponse, error) {
	req.Holder = n.holder(req.Holder)
	var tr metadata.MD
	up, err := n.up.leases(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := up.Release(ctx, req, grpc.Trailer(&tr))
	_ = grpc.SetTrailer(ctx, n.trailer(tr))
	return resp, err
}

func (n *mergerNode) Watch(req *rationv1.WatchRequest, stream grpc.ServerStreamingServer[rationv1.Nudge]) error {
	req.Holder = n.holder(req.Holder)
	client, err := n.up.leases(stream.Context())
	if err != nil {
		return err
	}
	up, err := client.Watch(stream.Context(), req)
	if err != nil {
		return err
	}
	// Bounded by the stream: it ends when the node ends it or the agent
	// (or the merger's Stop) cancels it.
	for {
		nudge, err := up.Recv()
		if err != nil {
			stream.SetTrailer(n.trailer(up.Trailer()))
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := stream.Send(nudge); err != nil {
			return err
		}
	}
}
