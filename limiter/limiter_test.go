package limiter_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/limiter"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// writeRules writes a rules file into t's directory and returns its path.
func writeRules(t testing.TB, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// open is limiter.New that fails t on error and closes at its end.
func open(t testing.TB, cfg limiter.Config) *limiter.Limiter {
	t.Helper()
	l, err := limiter.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("limiter.New: %v", err)
	}
	t.Cleanup(l.Close)
	return l
}

func allow(t testing.TB, l *limiter.Limiter, req limiter.Request) limiter.Decision {
	t.Helper()
	d, err := l.Allow(context.Background(), req)
	if err != nil {
		t.Fatalf("Allow(%+v): %v", req, err)
	}
	return d
}

// A mode: redis rule on a real redis-server admits exactly its burst, then
// denies with a Retry-After; its metrics reach the caller's registry.
func TestRedisRuleAdmitsBurstThenDenies(t *testing.T) {
	redis := harness.StartRedis(t)
	reg := prometheus.NewRegistry()
	l := open(t, limiter.Config{
		RulesFile: writeRules(t, `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 5
    rate: 0.01
`),
		Redis:      redis.Addr,
		Registerer: reg,
	})
	req := limiter.Request{Descriptors: map[string]string{"user": "alice"}}
	for i := range 5 {
		d := allow(t, l, req)
		if !d.Allowed || d.Reason != limiter.ReasonOK || d.Rule != "per-user" || d.Limit != 5 || d.Status() != http.StatusOK {
			t.Fatalf("request %d: %+v, want admitted by per-user (limit 5, reason ok)", i+1, d)
		}
		if math.Abs(d.Remaining-float64(4-i)) > 0.01 { // 0.01 tokens/s refill meanwhile
			t.Errorf("request %d: remaining %v, want %d", i+1, d.Remaining, 4-i)
		}
	}
	d := allow(t, l, req)
	if d.Allowed || d.Reason != limiter.ReasonOverLimit || d.Status() != http.StatusTooManyRequests {
		t.Fatalf("request 6: %+v, want denied over_limit (429)", d)
	}
	// One token refills in 100s: the wait is about that, never 0.
	if d.RetryAfter < 90*time.Second || d.RetryAfter > 101*time.Second {
		t.Errorf("request 6: RetryAfter %v, want about 100s", d.RetryAfter)
	}
	// Another subject has its own bucket.
	if d := allow(t, l, limiter.Request{Descriptors: map[string]string{"user": "bob"}}); !d.Allowed {
		t.Errorf("bob: %+v, want admitted (own bucket)", d)
	}
	// The bucket is in Redis, under the sidecar's key.
	if n, err := redis.Client().Exists(context.Background(), "ration:{per-user|user=alice}").Result(); err != nil || n != 1 {
		t.Errorf("Redis key ration:{per-user|user=alice}: exists %d, %v; want 1", n, err)
	}
	// Request 6 is denied without asking Redis: its answer to request 5
	// left the bucket no whole token, and none can have refilled since.
	got := counter(t, reg, "ration_decisions_total", map[string]string{"rule": "per-user", "path": "cached", "result": "denied"})
	if got != 1 {
		t.Errorf("ration_decisions_total{rule=per-user,path=cached,result=denied} = %v, want 1", got)
	}
}

// counter is the value of one series of a counter in reg.
func counter(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

const leasedYAML = `
rules:
  - name: hot
    match: {endpoint: checkout}
    burst: 10
    rate: 1
    mode: leased
    lease: {period: 1s}
`

// A mode: leased rule is decided from a lease held from a real
// coordinator group: admitted while the lease lasts, and never more than
// B + r T over the test.
func TestLeasedRuleAdmitsWithinLease(t *testing.T) {
	coords := harness.StartCoordinators(t, 3, leasedYAML)
	reg := prometheus.NewRegistry()
	l := open(t, limiter.Config{
		RulesFile:       writeRules(t, leasedYAML),
		Coordinators:    coords.GRPCAddrs(),
		Insecure:        true,
		AgentID:         "embedded-1",
		DecisionTimeout: time.Second, // the first grant, on a loaded machine
		Registerer:      reg,
	})
	start := time.Now()
	admitted := 0
	req := limiter.Request{Descriptors: map[string]string{"endpoint": "checkout"}}
	// Until the first grant (one DecisionTimeout, longer on a loaded
	// machine) the rule's failure policy, fail_closed, denies.
	for d := allow(t, l, req); !d.Allowed; d = allow(t, l, req) {
		if d.Reason != limiter.ReasonUnavailable || time.Since(start) > 10*time.Second {
			t.Fatalf("before the first grant: %+v after %v, want unavailable (fail_closed) for at most 10s", d, time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	admitted++
	for range 30 {
		d := allow(t, l, req)
		if d.Allowed {
			admitted++
			if d.Reason != limiter.ReasonOK || d.Rule != "hot" {
				t.Errorf("admitted with %+v, want reason ok by rule hot", d)
			}
		} else if d.Reason != limiter.ReasonOverLimit {
			t.Errorf("denied with %+v, want over_limit (the lease is spent, not unavailable)", d)
		}
	}
	elapsed := time.Since(start).Seconds()
	if bound := 10 + 1*elapsed; admitted < 1 || float64(admitted) > bound {
		t.Fatalf("admitted %d in %.2fs, want between 1 and B + r T = %.1f", admitted, elapsed, bound)
	}
	leased := (counter(t, reg, "ration_decisions_total", map[string]string{"rule": "hot", "path": "leased", "result": "allowed"}))
	if leased != float64(admitted) {
		t.Errorf("ration_decisions_total{path=leased,result=allowed} = %v, want %d: every admission on the lease", leased, admitted)
	}
}

// Close returns the leases to the coordinators: after it, the group holds
// no lease of this limiter, and Allow answers ErrClosed.
func TestCloseReleasesLeases(t *testing.T) {
	coords := harness.StartCoordinators(t, 1, leasedYAML)
	l, err := limiter.New(context.Background(), limiter.Config{
		RulesFile: writeRules(t, leasedYAML), Coordinators: coords.GRPCAddrs(), Insecure: true,
		AgentID: "closer", DecisionTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	for d := allow(t, l, limiter.Request{Rule: "hot", Subject: "x"}); !d.Allowed; d = allow(t, l, limiter.Request{Rule: "hot", Subject: "x"}) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("no admission on a lease within 10s: %+v", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
	admin := coords.LeaderAdmin(t)
	held := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := admin.ListLeases(ctx, &rationv1.ListLeasesRequest{Quota: "hot|x"})
		if err != nil {
			t.Fatalf("ListLeases: %v", err)
		}
		n := 0
		for _, ls := range resp.GetLeases() {
			if strings.HasPrefix(ls.GetHolder(), "closer") {
				n++
			}
		}
		return n
	}
	if n := held(); n != 1 {
		t.Fatalf("before Close: %d leases of the limiter on hot|x, want 1", n)
	}
	l.Close()
	// Release is committed before it is answered, and Close waits for it.
	if n := held(); n != 0 {
		t.Fatalf("after Close: %d leases of the limiter on hot|x, want 0 (released)", n)
	}
	if _, err := l.Allow(context.Background(), limiter.Request{Rule: "hot", Subject: "x"}); !errors.Is(err, limiter.ErrClosed) {
		t.Fatalf("Allow after Close: %v, want ErrClosed", err)
	}
	l.Close() // twice is fine
}

// With Redis down, each rule's failure policy decides: fail_open admits,
// fail_closed answers 503, emergency spends its local allowance and then
// answers 503. A subject whose denial is certain (its bucket cannot have
// refilled since Redis last answered for it) stays denied, 429, whatever
// the policy: its quota is known to be spent.
func TestFailurePoliciesWhenRedisIsDown(t *testing.T) {
	redis := harness.StartRedis(t)
	l := open(t, limiter.Config{
		RulesFile: writeRules(t, `
rules:
  - name: open
    match: {open: "*"}
    burst: 1
    rate: 0.01
    on_failure: fail_open
  - name: closed
    match: {policy: closed}
    burst: 100
    rate: 100
    on_failure: fail_closed
  - name: emergency
    match: {policy: emergency}
    burst: 100
    rate: 100
    on_failure: emergency
    emergency: {burst: 3, rate: 0.01, max_duration: 1m}
`),
		Redis: redis.Addr,
	})
	req := func(p string) limiter.Request { return limiter.Request{Descriptors: map[string]string{"policy": p}} }
	open := func(s string) limiter.Request { return limiter.Request{Descriptors: map[string]string{"open": s}} }
	// Up: Redis decides (open's burst of 1 is spent by the second).
	if d := allow(t, l, open("spent")); !d.Allowed || d.Reason != limiter.ReasonOK {
		t.Fatalf("open, Redis up: %+v, want admitted ok", d)
	}
	if d := allow(t, l, open("spent")); d.Allowed {
		t.Fatalf("open, Redis up, second: %+v, want denied (burst 1)", d)
	}
	redis.Kill()
	if d := allow(t, l, open("spent")); d.Allowed || d.Reason != limiter.ReasonOverLimit || d.Status() != http.StatusTooManyRequests {
		t.Fatalf("fail_open, Redis down, the spent subject: %+v, want denied over_limit (429): it cannot have refilled", d)
	}
	for i := range 5 {
		if d := allow(t, l, open("fresh")); !d.Allowed || d.Reason != limiter.ReasonUnavailable || d.Status() != http.StatusOK {
			t.Fatalf("fail_open, Redis down, %d: %+v, want admitted, reason unavailable", i, d)
		}
		if d := allow(t, l, req("closed")); d.Allowed || d.Reason != limiter.ReasonUnavailable || d.Status() != http.StatusServiceUnavailable {
			t.Fatalf("fail_closed, Redis down, %d: %+v, want denied, reason unavailable (503)", i, d)
		}
	}
	for i := range 3 {
		if d := allow(t, l, req("emergency")); !d.Allowed || d.Reason != limiter.ReasonEmergency || d.Limit != 3 {
			t.Fatalf("emergency, Redis down, %d: %+v, want admitted by the emergency allowance (burst 3)", i, d)
		}
	}
	if d := allow(t, l, req("emergency")); d.Allowed || d.Reason != limiter.ReasonEmergency {
		t.Fatalf("emergency, Redis down, 4th: %+v, want denied: the allowance of 3 is spent", d)
	}
}

// Requests that can never be decided are errors naming what was wrong.
func TestInvalidRequests(t *testing.T) {
	redis := harness.StartRedis(t)
	l := open(t, limiter.Config{RulesFile: writeRules(t, `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 5
    rate: 1
`), Redis: redis.Addr})
	for _, tt := range []struct {
		req  limiter.Request
		want error
		text string
	}{
		{limiter.Request{Rule: "nope", Subject: "x"}, limiter.ErrUnknownRule, `"nope"`},
		{limiter.Request{Descriptors: map[string]string{"user": "a"}, Cost: 6}, limiter.ErrInvalidRequest, "burst"},
		{limiter.Request{Descriptors: map[string]string{"user": "a"}, Cost: -1}, limiter.ErrInvalidRequest, "cost"},
		{limiter.Request{Rule: "per-user"}, limiter.ErrInvalidRequest, "subject"},
	} {
		_, err := l.Allow(context.Background(), tt.req)
		if !errors.Is(err, tt.want) || !errors.Is(err, limiter.ErrInvalidRequest) || !strings.Contains(err.Error(), tt.text) {
			t.Errorf("Allow(%+v) = %v, want %v naming %s", tt.req, err, tt.want, tt.text)
		}
	}
}

// A Config New cannot run is an ErrConfig naming the field or the file's
// line, and leaves nothing running.
func TestBadConfig(t *testing.T) {
	redis := harness.StartRedis(t)
	good := `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 5
    rate: 1
`
	leased := writeRules(t, leasedYAML)
	reg := prometheus.NewRegistry()
	// A limiter registered on reg: its series stay there after Close.
	first, err := limiter.New(context.Background(), limiter.Config{RulesFile: writeRules(t, good), Redis: redis.Addr, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	first.Close()
	before := runtime.NumGoroutine()
	for _, tt := range []struct {
		name string
		cfg  limiter.Config
		want []string
	}{
		{"no rules file", limiter.Config{Redis: redis.Addr}, []string{"Config.RulesFile is empty"}},
		{"missing rules file", limiter.Config{RulesFile: filepath.Join(t.TempDir(), "absent.yaml"), Redis: redis.Addr}, []string{"absent.yaml"}},
		{"invalid rules file", limiter.Config{RulesFile: writeRules(t, "rules:\n  - name: x\n    burst: -1\n"), Redis: redis.Addr}, []string{"rules.yaml:3:"}},
		{"redis rule without Redis", limiter.Config{RulesFile: writeRules(t, good)}, []string{"Config.Redis", "per-user"}},
		{"leased rule without coordinators", limiter.Config{RulesFile: leased}, []string{"Config.Coordinators is empty", "hot"}},
		{"coordinators without TLS", limiter.Config{RulesFile: leased, Coordinators: []string{"127.0.0.1:1"}}, []string{"Config.Insecure"}},
		{"bad coordinator address", limiter.Config{RulesFile: leased, Coordinators: []string{"nohost"}, Insecure: true}, []string{`Config.Coordinators: "nohost"`}},
		{"half the TLS files", limiter.Config{RulesFile: leased, Coordinators: []string{"127.0.0.1:1"}, TLSCert: "a.crt"}, []string{"TLSCert, TLSKey and TLSCA"}},
		{"bad Redis address", limiter.Config{RulesFile: writeRules(t, good), Redis: "redis://"}, []string{"Config.Redis"}},
		{"decision timeout", limiter.Config{RulesFile: writeRules(t, good), Redis: redis.Addr, DecisionTimeout: time.Minute}, []string{"Config.DecisionTimeout 1m0s"}},
		{"registerer taken", limiter.Config{RulesFile: writeRules(t, good), Redis: redis.Addr, Registerer: reg}, []string{"Config.Registerer", "duplicate metrics collector"}},
	} {
		l, err := limiter.New(context.Background(), tt.cfg)
		if err == nil {
			l.Close()
			t.Errorf("%s: New succeeded, want ErrConfig", tt.name)
			continue
		}
		if !errors.Is(err, limiter.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", tt.name, err)
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not name %q", tt.name, err, w)
			}
		}
	}
	// Nothing left running: every goroutine a failed New started (Redis
	// pools, TLS reloads) has ended.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after the failed News, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Reason's names are the sidecar's (docs/api.md).
func TestReasonNames(t *testing.T) {
	want := map[limiter.Reason]string{
		limiter.ReasonOK: "ok", limiter.ReasonOverLimit: "over_limit", limiter.ReasonNoRule: "no_rule",
		limiter.ReasonShadow: "shadow", limiter.ReasonUnavailable: "unavailable", limiter.ReasonEmergency: "emergency",
	}
	for r, name := range want {
		if r.String() != name {
			t.Errorf("Reason(%d) = %q, want %q", r, r, name)
		}
	}
}

// The defaults of Config's zero fields are the sidecar's.
func TestDefaultsAreTheSidecars(t *testing.T) {
	c := agent.DefaultConfig()
	if c.DecisionTimeout != limiter.DefaultDecisionTimeout || c.ReloadInterval != limiter.DefaultReloadInterval || c.Region != limiter.DefaultRegion {
		t.Errorf("sidecar defaults: decision timeout %v, reload interval %v, region %q; limiter's: %v, %v, %q",
			c.DecisionTimeout, c.ReloadInterval, c.Region, limiter.DefaultDecisionTimeout, limiter.DefaultReloadInterval, limiter.DefaultRegion)
	}
}
