package bucket_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

// A rediss:// server's certificate must name the server however it is
// addressed: by a host name, or by an IP address (checked against the
// certificate's IP SANs), which is how Sentinel and Cluster hand out their
// servers. A certificate of the right CA that names another host is
// refused; -redis-tls-server-name says which name to expect when the
// address handed out is an IP and the certificate names a host.
func TestRedisTLSServerNameWhateverTheAddress(t *testing.T) {
	pki := harness.NewPKI(t)
	certs := map[string]tlsfiles.Files{
		"right": pki.Issue("redis"), // localhost and 127.0.0.1
		"other": pki.IssueFor("redis-other", []string{"redis.other.example"}, nil),
		"named": pki.IssueFor("redis-named", []string{"localhost"}, nil), // a host name, no IP SAN
	}
	client := pki.Issue("agent")

	type tc struct {
		name       string
		cert       string // which server
		host       string // how the client addresses it
		serverName string
		wantErr    string // "" : accepted
	}
	t.Run("single", func(t *testing.T) {
		servers := map[string]*harness.Redis{}
		for name, f := range certs {
			servers[name] = harness.StartRedis(t, harness.WithTLS(f, false))
		}
		for _, c := range []tc{
			{"another host's certificate, dialled by IP", "other", "127.0.0.1", "", "127.0.0.1"},
			{"another host's certificate, dialled by name", "other", "localhost", "", "localhost"},
			{"a host name's certificate, dialled by IP", "named", "127.0.0.1", "", "127.0.0.1"},
			{"another host's certificate, its name given", "other", "127.0.0.1", "redis.other.example", ""},
			{"a host name's certificate, its name given", "named", "127.0.0.1", "localhost", ""},
			{"another host's certificate, a wrong name given", "other", "127.0.0.1", "localhost", "localhost"},
			{"the right certificate, dialled by IP", "right", "127.0.0.1", "", ""},
			{"the right certificate, dialled by name", "right", "localhost", "", ""},
		} {
			t.Run(c.name, func(t *testing.T) {
				_, port, _ := net.SplitHostPort(servers[c.cert].TLSAddr)
				spec := "rediss://" + net.JoinHostPort(c.host, port)
				checkTLSName(t, spec, bucket.RedisTLS{CA: client.CA, ServerName: c.serverName}, c.wantErr)
			})
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		// The Sentinels hand out the primary as 127.0.0.1, however the
		// Sentinels themselves were given.
		s := harness.StartSentinelTLS(t, "m", certs["named"])
		for _, c := range []tc{
			{"a host name's certificate, Sentinels by name", "named", "localhost", "", "127.0.0.1"},
			{"a host name's certificate, its name given", "named", "127.0.0.1", "localhost", ""},
			{"a host name's certificate, another name given", "named", "localhost", "redis.other.example", "redis.other.example"},
		} {
			t.Run(c.name, func(t *testing.T) {
				var sentinels []string
				for _, a := range s.SentinelTLSAddrs {
					_, port, _ := net.SplitHostPort(a)
					sentinels = append(sentinels, net.JoinHostPort(c.host, port))
				}
				spec := "rediss-sentinel://" + strings.Join(sentinels, ",") + "/m"
				checkTLSName(t, spec, bucket.RedisTLS{CA: client.CA, ServerName: c.serverName}, c.wantErr)
			})
		}
	})
	t.Run("cluster", func(t *testing.T) {
		// A Cluster answers CLUSTER SLOTS with its nodes' IP addresses,
		// so every command goes to a node addressed by IP, whatever the
		// seeds were given as.
		clusters := map[string]*harness.Cluster{
			"named": harness.StartCluster(t, harness.WithTLS(certs["named"], false)),
			"right": harness.StartCluster(t, harness.WithTLS(certs["right"], false)),
		}
		for _, c := range []tc{
			{"a host name's certificate, seeds by name", "named", "localhost", "", "127.0.0.1"},
			{"a host name's certificate, seeds by IP", "named", "127.0.0.1", "", "127.0.0.1"},
			{"a host name's certificate, its name given", "named", "127.0.0.1", "localhost", ""},
			{"a host name's certificate, another name given", "named", "localhost", "redis.other.example", "redis.other.example"},
			{"the right certificate, seeds by IP", "right", "127.0.0.1", "", ""},
		} {
			t.Run(c.name, func(t *testing.T) {
				var seeds []string
				for _, a := range clusters[c.cert].TLSAddrs {
					_, port, _ := net.SplitHostPort(a)
					seeds = append(seeds, net.JoinHostPort(c.host, port))
				}
				spec := "rediss-cluster://" + strings.Join(seeds, ",")
				checkTLSName(t, spec, bucket.RedisTLS{CA: client.CA, ServerName: c.serverName}, c.wantErr)
			})
		}
	})
}

// checkTLSName opens spec and reaches every primary (CheckVersion asks each
// one) and writes a key; wantErr "" wants that to succeed, else to fail
// with a certificate error naming wantErr.
func checkTLSName(t *testing.T, spec string, o bucket.RedisTLS, wantErr string) {
	t.Helper()
	c, err := bucket.OpenRedisTLS(spec, testTimeout, o)
	if err != nil {
		t.Fatalf("OpenRedisTLS(%q): %v", spec, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = bucket.CheckVersion(ctx, c)
	if err == nil {
		err = c.Set(ctx, "tls-name", "v", 0).Err()
	}
	switch {
	case wantErr == "" && err != nil:
		t.Fatalf("%s: %v, want accepted", spec, err)
	case wantErr != "" && err == nil:
		t.Fatalf("%s: accepted, want the server's certificate refused for %s", spec, wantErr)
	case wantErr != "" && (!strings.Contains(err.Error(), "certificate") || !strings.Contains(err.Error(), wantErr)):
		t.Fatalf("%s: %v, want a certificate error naming %s", spec, err, wantErr)
	}
}
