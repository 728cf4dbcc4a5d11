package bucket_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
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
	_, err := bucket.OpenRedis("redis-sentinel://"+addrs+"/m?bogus=1&sentinel_password=sentinel-pw", testTimeout)
	if err == nil || strings.Contains(err.Error(), "sentinel-pw") || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("unknown query parameter: %v, want refused naming it, without the password", err)
	}
	// After a password, what looks like another parameter may be the rest
	// of a password holding an unencoded '&': it is hidden too.
	_, err = bucket.OpenRedis("redis-sentinel://"+addrs+"/m?sentinel_password=sentinel-pw&bogus=1", testTimeout)
	if err == nil || strings.Contains(err.Error(), "sentinel-pw") || strings.Contains(err.Error(), "bogus") {
		t.Errorf("unknown query parameter after the password: %v, want refused, without the password or what follows it", err)
	}
}

// A rotation replaces the CA, the server's certificate and the client's
// certificate and key in place (what cert-manager does): after the server
// restarts with its new files, the same client makes its new connections
// with the new files, without being reopened. A client that read its files
// once cannot: it presents a certificate of the old CA and distrusts the
// server's new one.
func TestRedisTLSFilesReloaded(t *testing.T) {
	pki := harness.NewPKI(t)
	srv := pki.Issue("redis")
	r := harness.StartRedis(t, harness.WithTLS(srv, true))
	files := pki.Issue("agent")
	c, err := bucket.OpenRedisTLS("rediss://"+r.TLSAddr, testTimeout, bucket.RedisTLS{CA: files.CA, Cert: files.Cert, Key: files.Key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING over TLS before the rotation: %v", err)
	}

	next := harness.NewPKI(t) // the new CA
	for _, f := range []struct {
		files tlsfiles.Files
		name  string
	}{{srv, "redis"}, {files, "agent"}} {
		next.Reissue(f.files, f.name)
		writeFile(t, f.files.CA, next.CA.CertPEM)
	}
	r.Restart() // reads its new files; every pooled connection is closed
	// The files are checked at most once a second.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Ping(ctx).Err()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("PING after the rotation: %v; want the client to use the rotated files", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	st := bucket.NewRedisStore(c, bucket.RedisOptions{Timeout: testTimeout})
	if _, err := st.Take(ctx, bucket.Request{Key: bucket.Key("tls", "bob"), Limit: bucket.Limit{Burst: 2, Rate: 1}, Cost: 1}); err != nil {
		t.Fatalf("decision after the rotation: %v", err)
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
