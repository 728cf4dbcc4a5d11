package main

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
)

// No -redis, however malformed, gets its password, user information or
// secret query parameter printed: not in the start-up error, not in a log
// line (debug level, go-redis's own lines included), not as the default
// -h and a flag error show when it comes from RATION_REDIS, whatever special
// character the secret holds and wherever it sits. Each secret is
// secretHead + a special character + secretTail, so a fragment of it on
// either side of the character is found too.
func TestRedisSecretsNeverPrinted(t *testing.T) {
	const secretHead, secretTail = "Sx3cr3t", "Qz9kW"
	r := harness.StartRedis(t, harness.WithPassword("the-real-one"))
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte("rules:\n  - name: a\n    match: {k: v}\n    burst: 10\n    rate: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hp := r.Addr
	// Every special character, and invalid and valid percent-escapes.
	specials := []string{"/", "?", "#", "@", "%", ":", "&", ",", "=", "%zz", "%2F", "%", " ", "\\"}
	// Where the secret goes: SECRET stands for it.
	forms := []string{
		"redis://ration:SECRET@" + hp,
		"redis://:SECRET@" + hp + "/0",
		"redis://SECRET@" + hp,
		"rediss://ration:SECRET@" + hp,
		"redis-sentinel://ration:SECRET@" + hp + "/m",
		"redis-sentinel://" + hp + "/m?sentinel_password=SECRET",
		"redis-sentinel://" + hp + "/m?sentinel_username=u&sentinel_password=SECRET&x=1",
		"redis-cluster://ration:SECRET@" + hp + "," + hp,
		"redis://" + hp + "?password=SECRET",
		"ration:SECRET@" + hp,
	}
	for _, form := range forms {
		for _, sp := range specials {
			secret := secretHead + sp + secretTail
			spec := strings.ReplaceAll(form, "SECRET", secret)
			t.Run(spec, func(t *testing.T) {
				t.Parallel()
				out, err := runWithRedis(t, rulesFile, spec)
				printed := out
				if err != nil {
					printed += "\n" + err.Error()
				}
				// From RATION_REDIS, the value is the flag's default,
				// which -h and a flag error print.
				env := func(k string) (string, bool) { return spec, k == "RATION_REDIS" }
				for _, args := range [][]string{{"-h"}, {"-bogus"}} {
					var stdout, stderr harness.LogBuffer
					err := run(context.Background(), args, &stdout, &stderr, env)
					printed += "\n" + stdout.String() + stderr.String()
					if err != nil {
						printed += "\n" + err.Error()
					}
				}
				leaked := []string{secretHead, secretTail, secret}
				if u, uerr := url.PathUnescape(secret); uerr == nil {
					leaked = append(leaked, u)
				}
				for _, s := range leaked {
					if strings.Contains(printed, s) {
						t.Fatalf("-redis %q: %q printed:\n%s", spec, s, printed)
					}
				}
			})
		}
	}
}

// runWithRedis runs the agent with -redis spec at debug level until it
// fails to start or has started, and returns what it printed and its
// error.
func runWithRedis(t *testing.T, rulesFile, spec string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr harness.LogBuffer
	done := make(chan error, 1)
	args := []string{"-rules", rulesFile, "-redis", spec, "-http", "127.0.0.1:0", "-grpc", "127.0.0.1:0", "-log-level", "debug"}
	go func() { done <- run(ctx, args, &stdout, &stderr, noEnv) }()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case err := <-done:
			return stdout.String() + stderr.String(), err
		case <-deadline:
			t.Fatalf("-redis %q: neither started nor failed in 30s; printed:\n%s%s", spec, stdout.String(), stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if strings.Contains(stderr.String(), "gateway-agent started") {
			// Let a decision-less agent try its store a little: the
			// readiness probe and go-redis log their failures.
			time.Sleep(300 * time.Millisecond)
			cancel()
			err := <-done
			return stdout.String() + stderr.String(), err
		}
	}
}
