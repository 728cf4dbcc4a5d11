package limiter_test

import (
	"context"
	"errors"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/limiter"
)

// keyYAML is a leased quota that hardly refills, so that what the test
// spends is what the lease held, and a Redis rule beside it.
const keyYAML = `
rules:
  - name: hot
    match: {endpoint: checkout}
    burst: 20
    rate: 0.001
    mode: leased
    lease: {period: 1s}
  - name: per-user
    match: {user: "*"}
    burst: 3
    rate: 0.001
`

// waitKey decides through k until the quota's first grant admits.
func waitKey(t testing.TB, k *limiter.Key) limiter.Decision {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err := k.Allow(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed && d.Reason == limiter.ReasonOK {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("no admission through the Key within 10s: %+v", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A Key decides as Allow does: on a leased rule they spend one lease
// (alternating, no more than its burst in all), answer the same fields
// (rule, limit, rate; over_limit with a Retry-After once it is spent),
// and both count in ration_decisions_total. On a Redis rule a Key is
// Allow's round trip.
func TestKeyDecidesAsAllow(t *testing.T) {
	coords := harness.StartCoordinators(t, 1, keyYAML)
	redis := harness.StartRedis(t)
	reg := prometheus.NewRegistry()
	l := open(t, limiter.Config{
		RulesFile: writeRules(t, keyYAML), Redis: redis.Addr, Coordinators: coords.GRPCAddrs(), Insecure: true,
		AgentID: "key-1", DecisionTimeout: time.Second, Registerer: reg,
	})
	ctx := context.Background()
	k, err := l.Key("hot", "x")
	if err != nil {
		t.Fatal(err)
	}
	req := limiter.Request{Rule: "hot", Subject: "x"}
	first := waitKey(t, k)
	if first.Rule != "hot" || first.Limit != 20 || first.Rate != 0.001 {
		t.Fatalf("first admission through the Key: %+v, want rule hot, limit 20, rate 0.001", first)
	}
	admitted := 1
	var lastKey, lastAllow limiter.Decision
	for i := range 40 {
		var d limiter.Decision
		if i%2 == 0 {
			d, err = k.Allow(ctx, 1)
			lastKey = d
		} else {
			d, err = l.Allow(ctx, req)
			lastAllow = d
		}
		if err != nil {
			t.Fatal(err)
		}
		if d.Rule != "hot" || d.Limit != 20 || d.Rate != 0.001 {
			t.Fatalf("decision %d: %+v, want rule hot, limit 20, rate 0.001", i, d)
		}
		switch {
		case d.Allowed && d.Reason == limiter.ReasonOK:
			admitted++
		case !d.Allowed && d.Reason == limiter.ReasonOverLimit && d.RetryAfter > 0:
		default:
			t.Fatalf("decision %d: %+v, want admitted (ok) or over_limit with a Retry-After", i, d)
		}
	}
	if admitted > 20 {
		t.Fatalf("admitted %d through the Key and Allow together, burst 20 (rate 0.001/s): they spent apart", admitted)
	}
	if lastKey.Allowed || lastAllow.Allowed {
		t.Fatalf("after 41 decisions of burst 20: Key %+v, Allow %+v; want both denied", lastKey, lastAllow)
	}
	// The same spent lease, one after the other: the same answer but for
	// the time that passed between them.
	if math.Abs(lastKey.Remaining-lastAllow.Remaining) > 0.01 || (lastKey.RetryAfter-lastAllow.RetryAfter).Abs() > 10*time.Second {
		t.Errorf("denials of one spent lease differ: Key %+v, Allow %+v", lastKey, lastAllow)
	}
	got := counter(t, reg, "ration_decisions_total", map[string]string{"rule": "hot", "path": "leased", "result": "allowed"})
	if got != float64(admitted) {
		t.Errorf("ration_decisions_total{rule=hot,path=leased,result=allowed} = %v, want %d: a Key's decisions are counted", got, admitted)
	}
	denied := counter(t, reg, "ration_decisions_total", map[string]string{"rule": "hot", "path": "leased", "result": "denied"})
	if want := 41 - float64(admitted); denied != want {
		t.Errorf("ration_decisions_total{rule=hot,path=leased,result=denied} = %v, want %v", denied, want)
	}

	// A Redis rule: Allow's round trip, burst 3 shared with Allow.
	u, err := l.Key("per-user", "alice")
	if err != nil {
		t.Fatal(err)
	}
	var answers []bool
	for i := range 4 {
		var d limiter.Decision
		if i%2 == 0 {
			d, err = u.Allow(ctx, 1)
		} else {
			d, err = l.Allow(ctx, limiter.Request{Rule: "per-user", Subject: "alice"})
		}
		if err != nil {
			t.Fatal(err)
		}
		answers = append(answers, d.Allowed)
	}
	if want := []bool{true, true, true, false}; !slices.Equal(answers, want) {
		t.Fatalf("Redis rule through a Key and Allow: admitted %v, want %v (one bucket of burst 3)", answers, want)
	}
}

// What Allow refuses, Key and Key.Allow refuse with the same error: an
// unknown rule or a bad subject when the Key is made, a bad cost at each
// decision (and no token is spent); after Close, ErrClosed.
func TestKeyInvalid(t *testing.T) {
	coords := harness.StartCoordinators(t, 1, keyYAML)
	redis := harness.StartRedis(t)
	l, err := limiter.New(context.Background(), limiter.Config{
		RulesFile: writeRules(t, keyYAML), Redis: redis.Addr, Coordinators: coords.GRPCAddrs(), Insecure: true,
		AgentID: "key-invalid", DecisionTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for _, tt := range []struct {
		rule, subject string
		want          error
		text          string
	}{
		{"nope", "x", limiter.ErrUnknownRule, `"nope"`},
		{"hot", "", limiter.ErrInvalidRequest, "subject"},
		{"", "x", limiter.ErrInvalidRequest, "without a rule"},
		{"hot", strings.Repeat("s", 300), limiter.ErrInvalidRequest, "subject must be 1 to 256 bytes"},
		{"hot", strings.Repeat("s", 256), limiter.ErrInvalidRequest, "quota id"},
		{"hot", "\xff", limiter.ErrInvalidRequest, "UTF-8"},
	} {
		_, err := l.Key(tt.rule, tt.subject)
		_, want := l.Allow(ctx, limiter.Request{Rule: tt.rule, Subject: tt.subject})
		if !errors.Is(err, tt.want) || !errors.Is(err, limiter.ErrInvalidRequest) || !strings.Contains(err.Error(), tt.text) {
			t.Errorf("Key(%q, %.20q) = %v, want %v naming %s", tt.rule, tt.subject, err, tt.want, tt.text)
		}
		if want == nil || err.Error() != want.Error() {
			t.Errorf("Key(%q, %.20q) = %v; Allow says %v", tt.rule, tt.subject, err, want)
		}
	}
	k, err := l.Key("hot", "x")
	if err != nil {
		t.Fatal(err)
	}
	before := waitKey(t, k)
	for _, cost := range []float64{-1, 21, math.NaN(), math.Inf(1)} {
		_, err := k.Allow(ctx, cost)
		_, want := l.Allow(ctx, limiter.Request{Rule: "hot", Subject: "x", Cost: cost})
		if !errors.Is(err, limiter.ErrInvalidRequest) || want == nil || err.Error() != want.Error() {
			t.Errorf("Key.Allow(cost %v) = %v; Allow says %v; want ErrInvalidRequest", cost, err, want)
		}
	}
	after, err := k.Allow(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !after.Allowed || math.Abs(after.Remaining-(before.Remaining-1)) > 0.01 {
		t.Errorf("after refused costs: %+v; before them %+v: want one token less, nothing spent by the refusals", after, before)
	}
	l.Close()
	if _, err := k.Allow(ctx, 1); !errors.Is(err, limiter.ErrClosed) {
		t.Errorf("Key.Allow after Close: %v, want ErrClosed", err)
	}
	if _, err := l.Key("hot", "x"); !errors.Is(err, limiter.ErrClosed) {
		t.Errorf("Key after Close: %v, want ErrClosed", err)
	}
}

// A Key follows reloads of the rules file: a rule made shadow answers
// shadow at once, a removed rule is ErrUnknownRule, and the rule put back
// decides again.
func TestKeyFollowsReload(t *testing.T) {
	coords := harness.StartCoordinators(t, 1, keyYAML)
	redis := harness.StartRedis(t)
	path := writeRules(t, keyYAML)
	l := open(t, limiter.Config{
		RulesFile: path, Redis: redis.Addr, Coordinators: coords.GRPCAddrs(), Insecure: true,
		AgentID: "key-reload", DecisionTimeout: time.Second,
	})
	ctx := context.Background()
	k, err := l.Key("hot", "x")
	if err != nil {
		t.Fatal(err)
	}
	waitKey(t, k)
	for range 25 { // past the burst of 20
		if _, err := k.Allow(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	if d, _ := k.Allow(ctx, 1); d.Allowed {
		t.Fatalf("after 26 decisions of burst 20: %+v, want denied", d)
	}
	reload := func(yaml string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := l.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	reload(strings.Replace(keyYAML, "mode: leased", "mode: leased\n    shadow: true", 1))
	if d, err := k.Allow(ctx, 1); err != nil || !d.Allowed || d.Reason != limiter.ReasonShadow {
		t.Fatalf("spent quota of a rule reloaded as shadow: %+v, %v; want admitted, reason shadow", d, err)
	}
	without := keyYAML[:strings.Index(keyYAML, "  - name: hot")] + keyYAML[strings.Index(keyYAML, "  - name: per-user"):]
	reload(without)
	if _, err := k.Allow(ctx, 1); !errors.Is(err, limiter.ErrUnknownRule) {
		t.Fatalf("rule removed by a reload: %v, want ErrUnknownRule", err)
	}
	reload(keyYAML)
	if d, err := k.Allow(ctx, 1); err != nil || d.Allowed || d.Reason != limiter.ReasonOverLimit {
		t.Fatalf("rule put back (its lease still spent): %+v, %v; want over_limit", d, err)
	}
}

// Many goroutines deciding one leased quota through a Key and through
// Allow at once admit no more than the quota's B + r·T in all (the
// coordinator grants one holder no more), and each decision is counted
// once. Run under -race, this is the Key's concurrency check.
func TestKeyConcurrentWithinBound(t *testing.T) {
	const yaml = `
rules:
  - name: hot
    match: {endpoint: checkout}
    burst: 50
    rate: 100
    mode: leased
    lease: {period: 1s}
`
	coords := harness.StartCoordinators(t, 1, yaml)
	reg := prometheus.NewRegistry()
	l := open(t, limiter.Config{
		RulesFile: writeRules(t, yaml), Coordinators: coords.GRPCAddrs(), Insecure: true,
		AgentID: "key-many", DecisionTimeout: time.Second, Registerer: reg,
	})
	k, err := l.Key("hot", "x")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitKey(t, k)
	ctx := context.Background()
	var admitted, decided atomic.Int64
	admitted.Add(1)
	decided.Add(1)
	var wg sync.WaitGroup
	stop := time.Now().Add(time.Second)
	for g := range 8 {
		wg.Go(func() {
			for i := 0; i < 200000 && time.Now().Before(stop); i++ {
				var d limiter.Decision
				var err error
				if (g+i)%4 == 0 {
					d, err = l.Allow(ctx, limiter.Request{Rule: "hot", Subject: "x"})
				} else {
					d, err = k.Allow(ctx, 1)
				}
				if err != nil {
					t.Error(err)
					return
				}
				decided.Add(1)
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	if bound := 50 + 100*elapsed; float64(admitted.Load()) > bound {
		t.Fatalf("admitted %d in %.2fs, want at most B + r·T = %.0f", admitted.Load(), elapsed, bound)
	}
	if admitted.Load() < 50 {
		t.Fatalf("admitted %d in %.2fs: not even the burst", admitted.Load(), elapsed)
	}
	var counted float64
	for _, res := range []string{"allowed", "denied"} {
		counted += counter(t, reg, "ration_decisions_total", map[string]string{"rule": "hot", "result": res})
	}
	// Decisions before the first grant fall to the failure policy (path
	// fallback), counted too: the labels above take every path.
	if int64(counted) < decided.Load() {
		t.Errorf("ration_decisions_total = %v, want at least the %d decisions made", counted, decided.Load())
	}
}
