package bucket_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
)

// rediss:// against a real redis-server speaking TLS on a port of its own,
// with client certificates required and an ACL user: the agent's store
// decides over it; a wrong password, a missing client certificate, a
// server of another CA and a wrong server name are all refused.
func TestRedisTLSAndACL(t *testing.T) {
	pki := harness.NewPKI(t)
	srv := pki.Issue("redis")
	r := harness.StartRedis(t, harness.WithTLS(srv, true),
		harness.WithConfig("user ration on >s3cret ~ration:* &* +@all"))
	client := pki.Issue("agent")
	tlsOpts := bucket.RedisTLS{CA: client.CA, Cert: client.Cert, Key: client.Key}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	open := func(spec string, o bucket.RedisTLS) error {
		c, err := bucket.OpenRedisTLS(spec, testTimeout, o)
		if err != nil {
			return err
		}
		defer c.Close()
		st := bucket.NewRedisStore(c, bucket.RedisOptions{Timeout: testTimeout})
		res, err := st.Take(ctx, bucket.Request{Key: bucket.Key("tls", "alice"), Limit: bucket.Limit{Burst: 2, Rate: 1}, Cost: 1})
		if err != nil {
			return err
		}
		if !res.Allowed {
			t.Errorf("first take over TLS: %+v, want allowed", res)
		}
		who, err := c.Do(ctx, "ACL", "WHOAMI").Text()
		if err != nil {
			return err
		}
		if who != "ration" {
			t.Errorf("ACL WHOAMI = %q, want ration", who)
		}
		return nil
	}
	if err := open("rediss://ration:s3cret@"+r.TLSAddr, tlsOpts); err != nil {
		t.Fatalf("rediss:// with the CA, a client certificate and the ACL user: %v", err)
	}
	other := harness.NewPKI(t)
	for _, tc := range []struct {
		name string
		spec string
		o    bucket.RedisTLS
		want string
	}{
		{"wrong password", "rediss://ration:nope@" + r.TLSAddr, tlsOpts, "WRONGPASS"},
		{"no client certificate", "rediss://ration:s3cret@" + r.TLSAddr, bucket.RedisTLS{CA: client.CA}, ""},
		{"server of another CA", "rediss://ration:s3cret@" + r.TLSAddr, bucket.RedisTLS{CA: other.Issue("x").CA, Cert: client.Cert, Key: client.Key}, "unknown authority"},
		{"wrong server name", "rediss://ration:s3cret@" + r.TLSAddr, bucket.RedisTLS{CA: client.CA, Cert: client.Cert, Key: client.Key, ServerName: "redis.example"}, "redis.example"},
		{"plaintext to the TLS port", "redis://ration:s3cret@" + r.TLSAddr, bucket.RedisTLS{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := open(tc.spec, tc.o)
			if err == nil {
				t.Fatal("succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := bucket.OpenRedisTLS("redis://"+r.Addr, testTimeout, tlsOpts); err == nil || !strings.Contains(err.Error(), "use rediss://") {
		t.Errorf("TLS settings with redis://: %v, want refused", err)
	}
}

// Sentinels that require a password of their own are reached with
// ?sentinel_password=; without it the primary cannot be found, and the
// password never appears in an error.
func TestSentinelPassword(t *testing.T) {
	s := harness.StartSentinelWithPassword(t, "m", "sentinel-pw")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addrs := strings.Join(s.SentinelAddrs, ",")
	c := openRedis(t, "redis-sentinel://"+addrs+"/m?sentinel_password=sentinel-pw", testTimeout)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through Sentinels with their password: %v", err)
	}
	if v, err := s.Primary.Client().Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("the primary holds %q, %v; want v", v, err)
	}
	bad := openRedis(t, "redis-sentinel://"+addrs+"/m", testTimeout)
	if err := bad.Set(ctx, "k", "w", 0).Err(); err == nil {
		t.Fatal("SET through password-protected Sentinels without the password succeeded")
	}
	_, err := bucket.OpenRedis("redis-sentinel://"+addrs+"/m?sentinel_password=sentinel-pw&bogus=1", testTimeout)
	if err == nil || strings.Contains(err.Error(), "sentinel-pw") || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("unknown query parameter: %v, want refused naming it, without the password", err)
	}
}
