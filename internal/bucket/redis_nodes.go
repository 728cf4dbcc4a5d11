package bucket

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// PrimaryNode names the one node of a store that is not a Redis Cluster (a
// single primary, a Sentinel-managed primary, the memory store): its
// breaker, its metrics' node label, its line on /readyz.
const PrimaryNode = "primary"

// UnservedNode names, for the breakers, the slots of a Redis Cluster that no
// master serves (unassigned: a master answered "CLUSTERDOWN Hash slot not
// served" for them). go-redis sends such a slot's commands to a random
// master, so counted against the master it went to, its failures would be
// spread over healthy masters (their breakers opening on another's slots,
// or their outage episodes flapping between failures and successes, which
// restarted an emergency allowance's max_duration each time). They count
// here instead, until a topology read shows an owner again.
const UnservedNode = "unserved"

// ErrUnknownNode: the node named is not a master of the Cluster's current
// topology (a failover or a resharding took its slots away).
var ErrUnknownNode = errors.New("bucket: not a master of the cluster")

// slotFlags marks slots of a Cluster.
type slotFlags [clusterSlots]atomic.Bool

// slotNotServed is a master's answer for a slot no master owns.
const slotNotServed = "CLUSTERDOWN Hash slot not served"

// markUnserved flags key's slot when err says no master serves it.
func (s *RedisStore) markUnserved(key string, err error) {
	var rerr redis.Error
	if s.unserved == nil || !errors.As(err, &rerr) {
		return
	}
	// Redis 7 keeps the code first in a script's error; older versions
	// quote it as "-CLUSTERDOWN ..." inside "ERR Error running script".
	if msg := rerr.Error(); strings.HasPrefix(msg, slotNotServed) || strings.Contains(msg, "-"+slotNotServed) {
		s.unserved[KeySlot(key)].Store(true)
	}
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// slotOwners remembers the last master each slot was seen on: a slot whose
// owner go-redis cannot name (no topology loaded: every node it knows was
// unreachable) is its last known owner's.
type slotOwners [clusterSlots]atomic.Pointer[string]

// Sharded reports whether keys are spread over several nodes (a Redis
// Cluster), each of which can fail on its own.
func (s *RedisStore) Sharded() bool {
	_, ok := s.c.(*redis.ClusterClient)
	return ok
}

// NodeOf names the node that decides key: the address of its slot's master
// as go-redis routes it (its topology follows failovers, reshardings and
// MOVED/ASK redirections), or PrimaryNode when the store is not a Cluster.
// It does no I/O once go-redis has loaded the topology. A slot go-redis
// cannot place now is its last known owner's; "" when it never had one.
func (s *RedisStore) NodeOf(ctx context.Context, key string) string {
	cc, ok := s.c.(*redis.ClusterClient)
	if !ok {
		return PrimaryNode
	}
	slot := KeySlot(key)
	if s.unserved[slot].Load() { // made with owners, with a Cluster client
		return UnservedNode
	}
	last := &s.owners[slot]
	n, err := cc.MasterForKey(ctx, key)
	if err != nil {
		if p := last.Load(); p != nil {
			return *p
		}
		return ""
	}
	addr := n.Options().Addr
	// Written only when the owner changes: a hot slot's decisions read it,
	// and a store per decision would bounce its cache line between cores.
	if p := last.Load(); p == nil || *p != addr {
		owner := addr // a copy, so that only a change allocates
		last.Store(&owner)
	}
	return addr
}

// PingNode checks that one node answers: PrimaryNode pings the store (as
// Ping does), an address pings that master of the Cluster, and fails with
// ErrUnknownNode when the current topology has no such master.
func (s *RedisStore) PingNode(ctx context.Context, node string) error {
	cc, ok := s.c.(*redis.ClusterClient)
	if !ok || node == PrimaryNode {
		return s.Ping(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if node == UnservedNode {
		return s.pingUnserved(ctx, cc)
	}
	var found atomic.Bool
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		if c.Options().Addr != node {
			return nil
		}
		found.Store(true)
		// PING answers on a master that has just restarted and not yet
		// rejoined (it refuses keyed commands with CLUSTERDOWN until it
		// has): its own view of the cluster's state is what says it can
		// decide.
		info, err := c.ClusterInfo(ctx).Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%w: %s: cluster_state is not ok", ErrUnavailable, node)
		}
		return nil
	})
	switch {
	case err != nil:
		return s.fail("ping "+node, err)
	case !found.Load():
		return fmt.Errorf("%w: %s", ErrUnknownNode, node)
	}
	return nil
}

// pingUnserved reads the Cluster's slots again (go-redis's routing too)
// and clears each flagged slot a master now serves; it fails while any
// flagged slot is still served by none.
func (s *RedisStore) pingUnserved(ctx context.Context, cc *redis.ClusterClient) error {
	cc.ReloadState(ctx)
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		return s.fail("cluster slots", err)
	}
	var owned slotFlags
	for _, sl := range slots {
		if len(sl.Nodes) == 0 {
			continue
		}
		for i := max(sl.Start, 0); i <= min(sl.End, clusterSlots-1); i++ {
			owned[i].Store(true)
		}
	}
	left := 0
	for i := range s.unserved {
		switch {
		case !s.unserved[i].Load():
		case owned[i].Load():
			s.unserved[i].Store(false)
		default:
			left++
		}
	}
	if left > 0 {
		return fmt.Errorf("%w: %d slots served by no master", ErrUnavailable, left)
	}
	return nil
}

// NodeSlots is one master and the slot ranges it serves.
type NodeSlots struct {
	Node  string
	Slots [][2]int // inclusive ranges, ascending
}

// Topology lists each master with its slots as the Cluster reports them
// now (CLUSTER SLOTS, as go-redis reads it), by address; a store that is
// not a Cluster has one node, PrimaryNode, and no slots. It does I/O: the
// agent reads it in its prober's loop, never per decision.
func (s *RedisStore) Topology(ctx context.Context) ([]NodeSlots, error) {
	cc, ok := s.c.(*redis.ClusterClient)
	if !ok {
		return []NodeSlots{{Node: PrimaryNode}}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, s.fail("cluster slots", err)
	}
	idx := map[string]int{}
	var out []NodeSlots
	for _, sl := range slots {
		if len(sl.Nodes) == 0 {
			continue
		}
		addr := sl.Nodes[0].Addr
		i, ok := idx[addr]
		if !ok {
			i = len(out)
			idx[addr] = i
			out = append(out, NodeSlots{Node: addr})
		}
		out[i].Slots = append(out[i].Slots, [2]int{int(sl.Start), int(sl.End)})
	}
	for i := range out {
		sort.Slice(out[i].Slots, func(a, b int) bool { return out[i].Slots[a][0] < out[i].Slots[b][0] })
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Node < out[b].Node })
	return out, nil
}

// KeySlot is key's Redis Cluster hash slot: CRC16 (XMODEM) of its hash tag
// (the part between the first "{" and the next "}", when not empty), else
// of the whole key, modulo 16384.
func KeySlot(key string) int {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						key = key[i+1 : j]
					}
					return int(crc16(key)) % clusterSlots
				}
			}
			break
		}
	}
	return int(crc16(key)) % clusterSlots
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

// crc16Table is CRC16-XMODEM (polynomial 0x1021) by byte.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
