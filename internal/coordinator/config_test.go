package coordinator

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/tlsfiles"
)

func TestDefaultAndDevConfigsAreValid(t *testing.T) {
	def := DefaultConfig()
	def.RulesFile = "rules.yaml"
	def.TLS = tlsfiles.Files{Cert: "node.crt", Key: "node.key", CA: "ca.crt"}
	dev := DevConfig()
	for name, c := range map[string]Config{"DefaultConfig": def, "DevConfig": dev} {
		if err := c.Validate(); err != nil {
			t.Errorf("%s().Validate() = %v, want nil", name, err)
		}
	}
}

// TestValidateNamesEveryProblem: each bad setting is reported, naming its
// flag, and all of them at once.
func TestValidateNamesEveryProblem(t *testing.T) {
	base := DefaultConfig()
	base.RulesFile = "rules.yaml"
	base.Insecure = true
	tests := []struct {
		name string
		edit func(*Config)
		want []string // substrings, one per expected problem
	}{
		{"empty id", func(c *Config) { c.ID = "" }, []string{"-id"}},
		{"id with space", func(c *Config) { c.ID = "a b" }, []string{"-id"}},
		{"bad raft address", func(c *Config) { c.RaftAddr = "nohost" }, []string{"-raft \"nohost\""}},
		{"unadvertisable raft address", func(c *Config) { c.RaftAddr = "0.0.0.0:1" }, []string{"-raft-advertise"}},
		{"unadvertisable grpc address", func(c *Config) { c.GRPCAddr = ":1" }, []string{"-grpc-advertise"}},
		{"same grpc and http", func(c *Config) { c.HTTPAddr = c.GRPCAddr }, []string{"-grpc and -http"}},
		{"same grpc and admin", func(c *Config) { c.AdminAddr = c.GRPCAddr }, []string{"-grpc and -admin"}},
		{"same raft and admin", func(c *Config) { c.AdminAddr = c.RaftAddr }, []string{"-raft and -admin"}},
		{"no admin address", func(c *Config) { c.AdminAddr = "" }, []string{"-admin: must not be empty"}},
		{"unadvertisable admin address", func(c *Config) { c.AdminAddr = "0.0.0.0:8303" }, []string{"-admin-advertise"}},
		{"bad admin advertise", func(c *Config) { c.AdminAdvertise = "nohost" }, []string{"-admin-advertise \"nohost\""}},
		// Plaintext only by choice: no TLS files and no -insecure (nor
		// -dev) is refused, naming the flags of both ways out.
		{"no TLS and no -insecure", func(c *Config) { c.Insecure = false },
			[]string{"no TLS files: set -tls-cert, -tls-key, -tls-ca (docs/security.md), or -insecure to run in plaintext"}},
		{"TLS and -insecure", func(c *Config) { c.TLS = tlsfiles.Files{Cert: "a", Key: "b", CA: "c"} }, []string{"choose plaintext or TLS"}},
		{"partial TLS", func(c *Config) { c.Insecure, c.TLS.Cert = false, "a" }, []string{"missing [-tls-key -tls-ca]"}},
		{"no data dir", func(c *Config) { c.DataDir = "" }, []string{"-data-dir"}},
		{"bootstrap and join", func(c *Config) { c.Bootstrap, c.Join = true, "127.0.0.1:1" }, []string{"-bootstrap and -join"}},
		{"bad join", func(c *Config) { c.Join = "x" }, []string{"-join"}},
		{"no rules", func(c *Config) { c.RulesFile = "" }, []string{"-rules"}},
		{"lease above heartbeat", func(c *Config) { c.LeaderLeaseTimeout = 2 * c.HeartbeatTimeout },
			[]string{"-raft-leader-lease-timeout 2s exceeds -raft-heartbeat-timeout 1s"}},
		{"election below heartbeat", func(c *Config) { c.ElectionTimeout = c.HeartbeatTimeout / 2 },
			[]string{"-raft-election-timeout 500ms is below -raft-heartbeat-timeout 1s"}},
		{"zero tick", func(c *Config) { c.TickInterval = 0 }, []string{"-tick"}},
		{"upstream without region", func(c *Config) { c.Upstream = "127.0.0.1:1" }, []string{"-upstream \"127.0.0.1:1\": a regional group needs -region"}},
		{"bad upstream address", func(c *Config) { c.Upstream, c.Region = "nohost", "eu" }, []string{"-upstream \"nohost\""}},
		{"bad region", func(c *Config) { c.Region = "EU" }, []string{"-region: \"EU\" must match"}},
		{"regional group named global", func(c *Config) { c.Upstream, c.Region = "127.0.0.1:1", "global" },
			[]string{"-region \"global\" with -upstream: \"global\" names the global group"}},
		{"bad upstream renew point", func(c *Config) { c.UpstreamRenewAt = 1 }, []string{"-upstream-renew-at 1: must be in (0, 1)"}},
		{"batch max", func(c *Config) { c.BatchMax = 0 }, []string{"-batch-max"}},
		{"batch wait", func(c *Config) { c.BatchWait = -time.Millisecond }, []string{"-batch-wait"}},
		{"negative margin", func(c *Config) { c.SafetyMargin = -1 }, []string{"-safety-margin"}},
		{"log level", func(c *Config) { c.LogLevel = "loud" }, []string{"-log-level"}},
		{"several at once", func(c *Config) { c.ID, c.TickInterval, c.LogLevel = "", 0, "x" },
			[]string{"-id", "-tick", "-log-level"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.edit(&c)
			err := c.Validate()
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
			}
			var n int
			if j, ok := err.(interface{ Unwrap() []error }); ok {
				n = len(j.Unwrap())
			}
			if n != len(tc.want) {
				t.Errorf("Validate() reported %d problems, want %d: %v", n, len(tc.want), err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to mention %q", err, w)
				}
			}
		})
	}
}

// TestConfigLayers: environment first, then flags override it; malformed
// variables are all reported.
func TestConfigLayers(t *testing.T) {
	env := map[string]string{
		"RATION_ID": "env-id", "RATION_GRPC": "127.0.0.1:9", "RATION_TICK": "250ms",
		"RATION_BOOTSTRAP": "true", "RATION_BATCH_MAX": "64",
	}
	c := DefaultConfig()
	if err := c.LoadEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.BindFlags(fs)
	if err := fs.Parse([]string{"-id", "flag-id"}); err != nil {
		t.Fatal(err)
	}
	if c.ID != "flag-id" || c.GRPCAddr != "127.0.0.1:9" || c.TickInterval != 250*time.Millisecond || !c.Bootstrap || c.BatchMax != 64 {
		t.Errorf("layered config = %+v", c)
	}
	bad := map[string]string{"RATION_TICK": "soon", "RATION_BOOTSTRAP": "maybe", "RATION_BATCH_MAX": "many"}
	err := c.LoadEnv(func(k string) (string, bool) { v, ok := bad[k]; return v, ok })
	for k := range bad {
		if err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("LoadEnv(bad) = %v, want it to name %s", err, k)
		}
	}
}
