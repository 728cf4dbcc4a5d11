package harness

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/internal/tlsfiles"
)

// Sentinel timing: the primary is judged down after sentinelDownAfter
// without an answer, so a failover completes in a few seconds.
const (
	sentinelDownAfter       = 1000 * time.Millisecond
	sentinelFailoverTimeout = 3000 * time.Millisecond
	sentinelReadyTimeout    = 30 * time.Second
)

// SentinelSet is a Sentinel-managed primary: one primary, one replica and
// three Sentinels (quorum 2), all on loopback.
type SentinelSet struct {
	Primary       *Redis // the primary at start; after a failover, Replica is
	Replica       *Redis
	Sentinels     []*Redis
	SentinelAddrs []string
	// SentinelTLSAddrs are the Sentinels' TLS ports (StartSentinelTLS).
	SentinelTLSAddrs []string
	MasterName       string
}

// StartSentinel starts a primary, a replica in sync with it, and three
// Sentinels monitoring it as name, and returns once every Sentinel knows the
// replica and the two other Sentinels (so a failover can be voted).
func StartSentinel(t testing.TB, name string) *SentinelSet {
	t.Helper()
	return startSentinel(t, name, "", nil)
}

// StartSentinelTLS is StartSentinel with every server and Sentinel also
// speaking TLS with the certificate server (WithTLS, no client
// certificate required), replication and monitoring over TLS: the
// Sentinels hand out the primary as 127.0.0.1 and its TLS port, as a TLS
// deployment's Sentinels hand out an IP address. MasterAddr and
// WaitForFailover, which speak plaintext, are not for such a set.
func StartSentinelTLS(t testing.TB, name string, server tlsfiles.Files) *SentinelSet {
	t.Helper()
	return startSentinel(t, name, "", &server)
}

// StartSentinelWithPassword is StartSentinel with Sentinels that require
// password (requirepass, and sentinel-pass between them); the Redis
// servers themselves require none.
func StartSentinelWithPassword(t testing.TB, name, password string) *SentinelSet {
	t.Helper()
	return startSentinel(t, name, password, nil)
}

func startSentinel(t testing.TB, name, password string, server *tlsfiles.Files) *SentinelSet {
	t.Helper()
	s := &SentinelSet{MasterName: name}
	var tlsOpts []RedisOption
	if server != nil {
		tlsOpts = []RedisOption{WithTLS(*server, false), WithConfig("tls-replication yes")}
	}
	s.Primary = StartRedis(t, tlsOpts...)
	primaryPort := s.Primary.Port
	if server != nil {
		primaryPort = s.Primary.TLSPort
	}
	s.Replica = StartRedis(t, append(tlsOpts, WithReplicaOf("127.0.0.1:"+strconv.Itoa(primaryPort)))...)
	ctx, cancel := context.WithTimeout(context.Background(), sentinelReadyTimeout)
	defer cancel()
	waitFor(ctx, t, "replica "+s.Replica.Addr+" in sync with "+s.Primary.Addr, func() (bool, string) {
		info, err := s.Replica.Client().Info(ctx, "replication").Result()
		if err != nil {
			return false, err.Error()
		}
		st := infoField(info, "master_link_status")
		return st == "up", "master_link_status:" + st
	})
	for i := 0; i < 3; i++ {
		c := redisConfig{sentinel: true, lines: []string{
			fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2", name, primaryPort),
			fmt.Sprintf("sentinel down-after-milliseconds %s %d", name, sentinelDownAfter.Milliseconds()),
			fmt.Sprintf("sentinel failover-timeout %s %d", name, sentinelFailoverTimeout.Milliseconds()),
			fmt.Sprintf("sentinel parallel-syncs %s 1", name),
		}}
		if password != "" {
			WithPassword(password)(&c)
			c.lines = append(c.lines, "sentinel sentinel-pass "+password)
		}
		for _, o := range tlsOpts {
			o(&c)
		}
		sn := startRedis(t, c)
		s.Sentinels = append(s.Sentinels, sn)
		s.SentinelAddrs = append(s.SentinelAddrs, sn.Addr)
		if sn.TLSAddr != "" {
			s.SentinelTLSAddrs = append(s.SentinelTLSAddrs, sn.TLSAddr)
		}
	}
	for _, sn := range s.Sentinels {
		waitFor(ctx, t, "sentinel "+sn.Addr+" to see the replica and 2 other sentinels", func() (bool, string) {
			m, err := sn.Client().Do(ctx, "SENTINEL", "MASTER", name).Result()
			if err != nil {
				return false, err.Error()
			}
			f := fields(m)
			return f["num-slaves"] == "1" && f["num-other-sentinels"] == "2",
				fmt.Sprintf("num-slaves=%s num-other-sentinels=%s", f["num-slaves"], f["num-other-sentinels"])
		})
	}
	return s
}

// MasterAddr is the primary's address as the Sentinels report it now (the
// first that answers).
func (s *SentinelSet) MasterAddr(ctx context.Context) (string, error) {
	var lastErr error
	for _, sn := range s.Sentinels {
		if !sn.Running() {
			continue
		}
		addr, err := sn.Client().Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterName).StringSlice()
		if err == nil && len(addr) == 2 {
			return addr[0] + ":" + addr[1], nil
		}
		lastErr = fmt.Errorf("sentinel %s: %v %v", sn.Addr, addr, err)
	}
	return "", lastErr
}

// WaitForFailover waits until a Sentinel names a primary other than the
// original one and that server says it is a master, and returns its address.
func (s *SentinelSet) WaitForFailover(ctx context.Context) (newAddr string, err error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := "no answer yet"
	for {
		addr, err := s.MasterAddr(ctx)
		switch {
		case err != nil:
			last = err.Error()
		case addr == s.Primary.Addr:
			last = "sentinels still name " + addr
		default:
			c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
			info, err := c.Info(ctx, "replication").Result()
			_ = c.Close()
			if err == nil && infoField(info, "role") == "master" {
				return addr, nil
			}
			last = fmt.Sprintf("sentinels name %s, which is not master yet (%v)", addr, err)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("harness: no failover of %s: %w (last: %s)", s.MasterName, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// waitFor polls cond every 50ms until it holds, failing the test with cond's
// last explanation when ctx ends.
func waitFor(ctx context.Context, t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	for {
		ok, why := cond()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("harness: waiting for %s: %v (last: %s)", what, ctx.Err(), why)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// fields reads a flat [k1 v1 k2 v2 ...] (RESP2) or map (RESP3) reply into a
// map of strings.
func fields(reply any) map[string]string {
	m := map[string]string{}
	switch r := reply.(type) {
	case []any:
		for i := 0; i+1 < len(r); i += 2 {
			m[toString(r[i])] = toString(r[i+1])
		}
	case map[any]any:
		for k, v := range r {
			m[toString(k)] = toString(v)
		}
	}
	return m
}

func toString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case int64:
		return strconv.FormatInt(v, 10)
	default:
		return fmt.Sprint(v)
	}
}
