// Package rlqsload is a test-only load program for scripts/bench-rlqs.sh:
// Envoys on RLQS (internal/harness's filter-like client), each deciding
// its requests itself on the token bucket assignments an agent lends, at a
// fixed offered rate. It runs only when RATION_RLQS_TARGET names an agent.
package rlqsload

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
)

// env reads a setting, or def when it is unset.
func env(t *testing.T, name, def string) string {
	t.Helper()
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// TestRLQSLoad runs RATION_RLQS_CLIENTS streams to RATION_RLQS_TARGET,
// together offering RATION_RLQS_RATE requests per second on one bucket
// ({user: a}, domain RATION_RLQS_DOMAIN) for RATION_RLQS_DURATION, each
// stream reporting every RATION_RLQS_INTERVAL; it writes the decisions
// made, as JSON, to RATION_RLQS_OUT (stdout if unset).
func TestRLQSLoad(t *testing.T) {
	target := os.Getenv("RATION_RLQS_TARGET")
	if target == "" {
		t.Skip("RATION_RLQS_TARGET not set: run by scripts/bench-rlqs.sh")
	}
	clients, err1 := strconv.Atoi(env(t, "RATION_RLQS_CLIENTS", "16"))
	rate, err2 := strconv.ParseFloat(env(t, "RATION_RLQS_RATE", "2000"), 64)
	d, err3 := time.ParseDuration(env(t, "RATION_RLQS_DURATION", "10s"))
	interval, err4 := time.ParseDuration(env(t, "RATION_RLQS_INTERVAL", "1s"))
	for _, err := range []error{err1, err2, err3, err4} {
		if err != nil {
			t.Fatalf("rlqsload: %v", err)
		}
	}
	if clients < 1 || !(rate > 0) || d <= 0 || d > 10*time.Minute || interval < time.Second {
		t.Fatalf("rlqsload: want clients >= 1, rate > 0, duration in (0, 10m], interval >= 1s; got %d, %g, %v, %v", clients, rate, d, interval)
	}
	domain := env(t, "RATION_RLQS_DOMAIN", "ration-bench")
	every := time.Duration(float64(time.Second) * float64(clients) / rate)
	id := map[string]string{"user": "a"}
	var cls []*harness.RLQSClient
	for range clients {
		cls = append(cls, harness.DialRLQS(t, target, domain, interval, nil))
	}
	start := time.Now()
	var wg sync.WaitGroup
	for _, cl := range cls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Open loop: requests at start + k*every, whatever the
			// decisions take (a decision is local: it does not wait).
			for k := 1; ; k++ {
				at := start.Add(time.Duration(k) * every)
				if at.Sub(start) > d {
					return
				}
				time.Sleep(time.Until(at))
				cl.Request(id)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var allowed, denied uint64
	for _, cl := range cls {
		if err := cl.Err(); err != nil {
			t.Fatalf("rlqsload: stream: %v", err)
		}
		a, n := cl.Decisions()
		allowed, denied = allowed+a, denied+n
	}
	out, err := json.Marshal(map[string]any{"clients": clients, "offered": rate, "seconds": elapsed.Seconds(),
		"decisions": allowed + denied, "allowed": allowed, "denied": denied})
	if err != nil {
		t.Fatal(err)
	}
	if p := os.Getenv("RATION_RLQS_OUT"); p != "" {
		if err := os.WriteFile(p, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	fmt.Println(string(out))
}
