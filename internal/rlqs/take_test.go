package rlqs

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/ration-dev/ration/internal/rules"
)

// script answers takes in turn and records what each asked.
type script struct {
	mu      sync.Mutex
	answers []Taken
	err     error
	costs   []float64
	spends  []time.Duration
	// delay is how long each take takes, slowFor longer for a subject
	delay   time.Duration
	slowFor map[string]time.Duration
}

func (s *script) Take(_ context.Context, _ *rules.Rule, subject string, cost float64, spend time.Duration) (Taken, error) {
	time.Sleep(s.delay + s.slowFor[subject])
	s.mu.Lock()
	defer s.mu.Unlock()
	s.costs = append(s.costs, cost)
	s.spends = append(s.spends, spend)
	if s.err != nil {
		return Taken{}, s.err
	}
	a := s.answers[0]
	if len(s.answers) > 1 {
		s.answers = s.answers[1:]
	}
	return a, nil
}

// A take's answer becomes the bucket's action: a funded take sends what it
// paid for (its cost is the assignment's burst plus its rate for its TTL
// and the delivery margin); a spent quota is asked once more at the
// smallest assignment, then denied until it may pay again; a failure
// policy's answer lasts FailTTL. Each case is a bucket's first report of
// 10 requests (demand 10/s) on a mode redis rule of burst 100, rate 50.
func TestTakeOutcomes(t *testing.T) {
	funded := Taken{Outcome: Funded}
	over := func(d time.Duration) Taken { return Taken{Outcome: Over, RetryAfter: d} }
	tests := []struct {
		name    string
		policy  string
		answers []Taken
		err     error
		kind    string
		burst   uint32
		rate    uint32
		ttl     int64
		takes   int
	}{
		// want: rate 1.5 x 10, burst half a second of it; a first
		// action lasts 1s.
		{"funded", "fail_closed", []Taken{funded}, nil, "token_bucket", 8, 15, 1, 1},
		{"over, then funded at the minimum", "fail_closed", []Taken{over(time.Second), funded}, nil, "token_bucket", 1, 1, 1, 2},
		{"over twice: denied until the retry", "fail_closed", []Taken{over(2500 * time.Millisecond)}, nil, "deny_all", 0, 0, 3, 2},
		{"over twice, retry now: at least 1s", "fail_closed", []Taken{over(0)}, nil, "deny_all", 0, 0, 1, 2},
		{"over twice, retry in an hour: at most MaxTTL", "fail_closed", []Taken{over(time.Hour)}, nil, "deny_all", 0, 0, 5, 2},
		{"unavailable, fail_closed", "fail_closed", []Taken{{Outcome: Unavailable}}, nil, "deny_all", 0, 0, 1, 1},
		{"open by fail_open", "fail_open", []Taken{{Outcome: Open}}, nil, "allow_all", 0, 0, 1, 1},
		// Half the emergency bucket's burst of 10 buys {1, 2/s, 1s}.
		{"emergency: unavailable, then funded within its bucket", "emergency", []Taken{{Outcome: Unavailable}, funded}, nil, "token_bucket", 1, 2, 1, 2},
		{"the rule was reloaded away", "fail_closed", []Taken{{Outcome: Gone}}, nil, "deny_all", 0, 0, 1, 1},
		{"refused: not enforced, fail_closed denies", "fail_closed", nil, errors.New("invalid"), "deny_all", 0, 0, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			y := "rules:\n  - name: r\n    match: {user: \"*\"}\n    burst: 100\n    rate: 50\n    on_failure: " + tt.policy + "\n"
			if tt.policy == "emergency" {
				y += "    emergency: {burst: 10, rate: 5, max_duration: 1m}\n"
			}
			set, err := rules.Parse("rules.yaml", []byte(y))
			if err != nil {
				t.Fatal(err)
			}
			sc := &script{answers: tt.answers, err: tt.err}
			c := serve(t, Options{Rules: staticRules{set}, Taker: sc})
			s, err := c.StreamRateLimitQuotas(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{use(map[string]string{"user": "a"}, 0, 10)}}); err != nil {
				t.Fatal(err)
			}
			resp, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			a := resp.GetBucketAction()[0]
			qa := a.GetQuotaAssignmentAction()
			if k := kindOf(a); k != tt.kind || qa.GetAssignmentTimeToLive().GetSeconds() != tt.ttl {
				t.Fatalf("got %s for %v; want %s for %ds", k, qa.GetAssignmentTimeToLive().AsDuration(), tt.kind, tt.ttl)
			}
			sc.mu.Lock()
			defer sc.mu.Unlock()
			if len(sc.costs) != tt.takes {
				t.Fatalf("%d takes (costs %v), want %d", len(sc.costs), sc.costs, tt.takes)
			}
			tb := qa.GetRateLimitStrategy().GetTokenBucket()
			if tb == nil {
				return
			}
			if tb.GetMaxTokens() != tt.burst || tb.GetTokensPerFill().GetValue() != tt.rate {
				t.Fatalf("token bucket %v, want burst %d rate %d", tb, tt.burst, tt.rate)
			}
			// What Envoy can spend under it, all taken before it was sent.
			want := float64(tt.burst) + float64(tt.rate)*(float64(tt.ttl)+0.2)
			if got := sc.costs[len(sc.costs)-1]; math.Abs(got-want) > 1e-9 {
				t.Fatalf("the take that funded it cost %v; Envoy can spend %v under it", got, want)
			}
			// ... and held for as long as Envoy may spend it: from the
			// take's start, the send (within SendMargin), the delivery
			// (Delta) and the TTL.
			wantSpend := SendMargin + 200*time.Millisecond + time.Duration(tt.ttl)*time.Second
			if got := sc.spends[len(sc.spends)-1]; got < wantSpend {
				t.Fatalf("the take that funded it was held for %v; Envoy may spend under it for %v", got, wantSpend)
			}
		})
	}
}

// TestLateTakenAssignmentNotSent: a take that returns after SendMargin
// (a slow store) was held for too short a time for an assignment sent
// now: a DENY_ALL goes instead, and the next report asks again.
func TestLateTakenAssignmentNotSent(t *testing.T) {
	set, err := rules.Parse("rules.yaml", []byte("rules:\n  - name: r\n    match: {user: \"*\"}\n    burst: 100\n    rate: 50\n"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		delay time.Duration
		kind  string
	}{
		{"in time", 0, "token_bucket"},
		{"late", SendMargin + 50*time.Millisecond, "deny_all"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := &script{answers: []Taken{{Outcome: Funded}}, delay: tt.delay}
			c := serve(t, Options{Rules: staticRules{set}, Taker: sc})
			s, err := c.StreamRateLimitQuotas(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{use(map[string]string{"user": "a"}, 0, 10)}}); err != nil {
				t.Fatal(err)
			}
			resp, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			a := resp.GetBucketAction()[0]
			if k := kindOf(a); k != tt.kind {
				t.Fatalf("a take that took %v: %s, want %s", tt.delay, k, tt.kind)
			}
		})
	}
}

// takeWant keeps a take's cost within half the store's burst (the rest is
// for other Envoys and direct callers), at the minimum assignment when no
// more fits, and finds no assignment at all for a store too small for it.
func TestTakeWantFitsTheStore(t *testing.T) {
	const delta = 200_000
	r := &rules.Rule{Name: "r", Burst: 1000, Rate: 1000}
	tests := []struct {
		name          string
		burst, demand float64
		ok            bool
	}{
		{"ample", 10000, 10, true},
		{"the rate cut to fit", 100, 1000, true},
		{"the minimum", 4, 1000, true},
		{"nothing fits", 2, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z, ok := takeWant(r, tt.burst, tt.demand, 2, delta)
			if ok != tt.ok {
				t.Fatalf("takeWant = %+v, %v; want ok %v", z, ok, tt.ok)
			}
			if !ok {
				return
			}
			if c := cost(z, delta); c > max(tt.burst/2, cost(minTake, delta)) || z.burst < 1 || z.rate < 1 || z.ttl < 1 {
				t.Fatalf("takeWant = %+v costs %v, over half the store's burst %v", z, c, tt.burst)
			}
		})
	}
}

// A bucket whose take is slow does not age the actions planned before it
// in the same report: they are sent before it waits, in time, and only
// its own assignment, sent late, is replaced by a denial.
func TestSlowTakeDoesNotAgeOthers(t *testing.T) {
	set, err := rules.Parse("rules.yaml", []byte("rules:\n  - name: r\n    match: {user: \"*\"}\n    burst: 100\n    rate: 50\n"))
	if err != nil {
		t.Fatal(err)
	}
	sc := &script{answers: []Taken{{Outcome: Funded}}, slowFor: map[string]time.Duration{"user=slow": SendMargin + 50*time.Millisecond}}
	c := serve(t, Options{Rules: staticRules{set}, Taker: sc})
	s, err := c.StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		use(map[string]string{"user": "fast"}, 0, 10), use(map[string]string{"user": "slow"}, 0, 10)}}); err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for len(kinds) < 2 {
		resp, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range resp.GetBucketAction() {
			kinds[a.GetBucketId().GetBucket()["user"]] = kindOf(a)
		}
	}
	if kinds["fast"] != "token_bucket" || kinds["slow"] != "deny_all" {
		t.Fatalf("actions %v; want the fast bucket's token bucket sent in time, the slow one's replaced by deny_all", kinds)
	}
}

// A take refused only because its hold would outlast the lease deciding
// it (Taken.Short) is asked again with the longest TTL whose spend fits
// in what the lease can fund, its rate and burst kept; not again when not
// even a TTL of 1s fits, or the TTL would not shrink. A plain Over asks
// for the smallest assignment.
func TestRetryShortensTTLToFitTheHold(t *testing.T) {
	const delta = 200_000
	r := &rules.Rule{Name: "r", Burst: 1000, Rate: 1000}
	z := sizes{burst: 9, rate: 18, ttl: 2}
	d := time.Duration(delta) * time.Microsecond
	tests := []struct {
		name string
		t    Taken
		want sizes
	}{
		{"a 1s TTL fits", Taken{Outcome: Over, Short: true, Within: spendFor(1, d)}, sizes{burst: 9, rate: 18, ttl: 1}},
		{"a 1s TTL fits, 2s not quite", Taken{Outcome: Over, Short: true, Within: spendFor(2, d) - time.Microsecond}, sizes{burst: 9, rate: 18, ttl: 1}},
		{"nothing fits", Taken{Outcome: Over, Short: true, Within: spendFor(1, d) - time.Microsecond}, z},
		{"over limit", Taken{Outcome: Over}, minTake},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := retry(r, tt.t, z, 100, delta); got != tt.want {
				t.Fatalf("retry after %+v = %+v, want %+v", tt.t, got, tt.want)
			}
		})
	}
}
