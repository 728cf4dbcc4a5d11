package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/ration-dev/ration/limiter"
)

// A Go service deciding in process. The rule is the sidecar's: a budget
// per user leased from the coordinator group and spent in memory, and an
// emergency allowance of 2 requests per user while the coordinators
// cannot be reached. (Rules in mode: redis need Config.Redis too.)
//
// So that the example runs anywhere, nothing listens at its coordinator
// address: every decision below is the failure policy's (reason
// emergency). With a coordinator group there, the same code is decided
// from the lease (reason ok, 10 requests, then over_limit).
func Example() {
	dir, err := os.MkdirTemp("", "limiter-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	rulesFile := filepath.Join(dir, "rules.yaml")
	err = os.WriteFile(rulesFile, []byte(`
rules:
  - name: per-user
    match: {user: "*"}
    burst: 10
    rate: 1
    mode: leased
    on_failure: emergency
    emergency: {burst: 2, rate: 0.001, max_duration: 1m}
`), 0o644)
	if err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	l, err := limiter.New(ctx, limiter.Config{
		RulesFile:    rulesFile,
		Coordinators: []string{"127.0.0.1:1"}, // the region's group; nothing listens here
		Insecure:     true,                    // in production: TLSCert, TLSKey, TLSCA
		AgentID:      "example",
	})
	if err != nil {
		log.Fatal(err) // errors.Is(err, limiter.ErrConfig), naming what is wrong
	}
	defer l.Close()

	for range 3 {
		d, err := l.Allow(ctx, limiter.Request{Descriptors: map[string]string{"user": "alice"}})
		if err != nil {
			log.Fatal(err)
		}
		// Status is what to answer: 200, 429 (wait d.RetryAfter) or 503.
		fmt.Println(d.Status(), d.Allowed, d.Reason)
	}

	_, err = l.Allow(ctx, limiter.Request{Rule: "per-user", Subject: "alice", Cost: 11})
	fmt.Println(errors.Is(err, limiter.ErrInvalidRequest))
	// Output:
	// 200 true emergency
	// 200 true emergency
	// 429 false emergency
	// true
}

// A subject decided often is checked once: its Key decides without
// matching or looking the quota up again (on a valid lease, in under
// 100 ns). As above, nothing listens at the coordinator address, so the
// failure policy decides, as it would for Allow.
func ExampleLimiter_Key() {
	dir, err := os.MkdirTemp("", "limiter-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	rulesFile := filepath.Join(dir, "rules.yaml")
	err = os.WriteFile(rulesFile, []byte(`
rules:
  - name: search-global
    match: {endpoint: search}
    burst: 1000
    rate: 500
    mode: leased
    on_failure: fail_closed
`), 0o644)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	l, err := limiter.New(ctx, limiter.Config{
		RulesFile: rulesFile, Coordinators: []string{"127.0.0.1:1"}, Insecure: true, AgentID: "example-key",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	k, err := l.Key("search-global", "all")
	if err != nil {
		log.Fatal(err) // limiter.ErrInvalidRequest: an unknown rule, a bad subject
	}
	d, err := k.Allow(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Status(), d.Rule, d.Reason)

	_, err = l.Key("no-such-rule", "all")
	fmt.Println(errors.Is(err, limiter.ErrUnknownRule))
	// Output:
	// 503 search-global unavailable
	// true
}
