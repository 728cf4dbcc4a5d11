package coordinator

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// join asks the cluster at cfg.Join (a member's admin address) to add this
// node as a voter, following redirects to the leader's admin address. It
// presents the node's certificate (a coordinator's may call the admin API)
// and its admin token, when it has one: the members of a group share it.
func (n *Node) join(ctx context.Context) error {
	opts := n.dialOptions(n.cfg.Group())
	if n.token != nil {
		if opts == nil {
			opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		}
		opts = append(opts, grpc.WithPerRPCCredentials(n.token.PerRPCCredentials()))
	}
	c := NewClient([]string{n.cfg.Join}, ClientOptions{MaxAttempts: 50, BackoffMax: time.Second, Logger: n.logger, DialOptions: opts})
	defer c.Close()
	if n.peers != nil {
		// Pin the members before asking to be added: the leader's first
		// AppendEntries is then admitted from them alone (raftpeers.go).
		pin, err := n.joinTargetMembers(ctx, c)
		if err != nil {
			return err
		}
		n.peers.pin(pin)
		n.logger.Info("joining: Raft RPCs admitted from the members the join target named", "members", slices.Sorted(maps.Keys(pin)))
	}
	_, err := c.AddVoter(ctx, &rationv1.AddVoterRequest{
		Id: n.cfg.ID, RaftAddress: n.raftAddr, GrpcAddress: n.grpcAddr, AdminAddress: n.adminAddr,
	})
	if err != nil {
		return fmt.Errorf("coordinator: join through %s: %w", n.cfg.Join, err)
	}
	n.logger.Info("joined the cluster", "through", n.cfg.Join)
	return nil
}

// joinTargetMembers is the Raft configuration the join target reports (id
// to Raft address), asked again for a while when it has none yet (a first
// node still bootstrapping).
func (n *Node) joinTargetMembers(ctx context.Context, c *Client) (map[string]string, error) {
	for try := 1; ; try++ {
		st, err := c.Status(ctx)
		if err != nil {
			return nil, fmt.Errorf("coordinator: join through %s: its view of the group: %w", n.cfg.Join, err)
		}
		pin := map[string]string{}
		for _, s := range st.GetServers() {
			pin[s.GetId()] = s.GetAddress()
		}
		if len(pin) > 0 {
			return pin, nil
		}
		if try == joinTries {
			return nil, fmt.Errorf("coordinator: join through %s: it names no member of group %q after %d tries (is it a member?)", n.cfg.Join, n.cfg.Group(), try)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("coordinator: join through %s: %w", n.cfg.Join, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// joinTries is how many times a join target that knows no configuration is
// asked again, a second apart.
const joinTries = 30
