package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// testPlan has round per-decision costs, so the expected sizings can be
// worked out by hand.
func testPlan() Plan {
	return Plan{
		Decisions:   1e6,
		LeasedShare: 0.2,
		Gateways:    200,
		HotQuotas:   10,
		LeasePeriod: 10 * time.Second,
		RenewAt:     0.5,
		Headroom:    0.3,
		GroupSize:   3,

		RedisUS:       10,   // 100,000 scripts/s per core
		AgentUS:       40,   //
		AgentLeasedUS: 20,   //
		AgentRate:     5000, // = PerGateway: no note
		RenewRPS:      1000, // 1 ms of a group per one-lease Renew
		RenewItemUS:   100,  // 0.1 ms per further lease
		RenewHolderUS: 0,    // TestSizeHolders sets it

		GRPCP99US:     300,
		RedisRTTP99US: 200,
		ScriptUS:      8,
		AllowP99US:    700,
		LeasedP99US:   320,
	}
}

func near(got, want float64) bool { return math.Abs(got-want) <= 1e-9*math.Max(1, math.Abs(want)) }

func TestSize(t *testing.T) {
	s := Size(testPlan())
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"RedisDecisions", s.RedisDecisions, 800000},
		{"LeasedDecisions", s.LeasedDecisions, 200000},
		{"PerGateway", s.PerGateway, 5000},
		// 800,000 x 10 µs = 8 cores; at 70% busy at most: 8 / 0.7 = 11.4 -> 12.
		{"RedisCores", s.RedisCores, 8},
		{"RedisShards", float64(s.RedisShards), 12},
		{"ShardCapacity", s.ShardCapacity, 70000},
		{"PerShard", s.PerShard, 800000.0 / 12},
		// 800,000 x 40 µs + 200,000 x 20 µs = 36 cores; / 0.7; / 200.
		{"AgentCores", s.AgentCores, 36},
		{"AgentCoresWithRoom", s.AgentCoresWithRoom, 36 / 0.7},
		{"AgentCoresPerGateway", s.AgentCoresPerGateway, 36 / 0.7 / 200},
		// One Renew per agent per 5s: 40/s, 400 leases/s. Each costs
		// 1 ms + 9 x 0.1 ms = 1.9 ms: 76 ms per second.
		{"RenewInterval", s.RenewInterval.Seconds(), 5},
		{"RenewRequests", s.RenewRequests, 40},
		{"RenewItems", s.RenewItems, 400},
		{"LeaderLoad", s.LeaderLoad, 0.076},
		{"CoordinatorGroups", float64(s.CoordinatorGroups), 1},
		{"CoordinatorNodes", float64(s.CoordinatorNodes), 3},
		// 0.7 x 5s / 1.9 ms = 1842.1 -> 1842.
		{"MaxGatewaysPerGroup", float64(s.MaxGatewaysPerGroup), 1842},
		// Load 0.076 at 10s; 0.7 at 10s x 0.076 / 0.7 = 1.0857s -> 1.1s.
		{"MinLeasePeriod", s.MinLeasePeriod.Seconds(), 1.1},
		{"AgentRestUS", s.AgentRestUS, 200},
	} {
		if !near(c.got, c.want) {
			t.Errorf("Size(testPlan()).%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestSizeRenewalsScaleWithGatewaysAndPeriodNotDecisions(t *testing.T) {
	base := Size(testPlan())

	p := testPlan()
	p.Decisions *= 10
	if got := Size(p).RenewRequests; got != base.RenewRequests {
		t.Errorf("10x decisions: RenewRequests = %v, want %v (renewals do not follow decisions)", got, base.RenewRequests)
	}

	p = testPlan()
	p.Gateways *= 2
	if got := Size(p).RenewRequests; !near(got, 2*base.RenewRequests) {
		t.Errorf("2x gateways: RenewRequests = %v, want %v", got, 2*base.RenewRequests)
	}

	p = testPlan()
	p.LeasePeriod *= 2
	if got := Size(p).RenewRequests; !near(got, base.RenewRequests/2) {
		t.Errorf("2x lease period: RenewRequests = %v, want %v", got, base.RenewRequests/2)
	}

	// More quotas per agent: the same number of requests, more leases in
	// each.
	p = testPlan()
	p.HotQuotas *= 10
	s := Size(p)
	if s.RenewRequests != base.RenewRequests || !near(s.RenewItems, 10*base.RenewItems) {
		t.Errorf("10x hot quotas: RenewRequests, RenewItems = %v, %v, want %v, %v",
			s.RenewRequests, s.RenewItems, base.RenewRequests, 10*base.RenewItems)
	}
}

// TestSizeHolders: renewing a lease recomputes its quota's fair share over
// every holder, so with every gateway holding every hot quota the
// coordinator's load grows faster than the gateways.
func TestSizeHolders(t *testing.T) {
	p := testPlan()
	p.RenewHolderUS = 1
	s := Size(p)
	// 1 ms + 9 x 0.1 ms + 10 leases x 199 further holders x 1 µs = 3.89 ms.
	if !near(s.RequestUS, 3890) || s.Holders != 200 {
		t.Errorf("200 holders: RequestUS, Holders = %v, %d, want 3890, 200", s.RequestUS, s.Holders)
	}
	if !near(s.LeaderLoad, 40*3.89e-3) {
		t.Errorf("200 holders: LeaderLoad = %v, want %v", s.LeaderLoad, 40*3.89e-3)
	}
	// G/5s x (1.9 ms + 10 (G-1) µs) <= 0.7 up to G = 504.
	if s.MaxGatewaysPerGroup != 504 {
		t.Errorf("200 holders: MaxGatewaysPerGroup = %d, want 504", s.MaxGatewaysPerGroup)
	}

	// Each quota held by 50 agents only: linear again.
	p.HoldersPerQuota = 50
	s = Size(p)
	// 1.9 ms + 10 x 49 x 1 µs = 2.39 ms; 0.7 x 5s / 2.39 ms = 1464.4.
	if !near(s.RequestUS, 2390) || s.Holders != 50 || s.MaxGatewaysPerGroup != 1464 {
		t.Errorf("50 holders: RequestUS, Holders, MaxGatewaysPerGroup = %v, %d, %d, want 2390, 50, 1464",
			s.RequestUS, s.Holders, s.MaxGatewaysPerGroup)
	}

	// More holders than gateways cannot be.
	p.HoldersPerQuota = 1000
	if s := Size(p); s.Holders != 200 {
		t.Errorf("-holders-per-quota 1000 with 200 gateways: Holders = %d, want 200", s.Holders)
	}
}

func TestSizeEdges(t *testing.T) {
	// Nothing leased: no coordinator, all decisions on Redis.
	p := testPlan()
	p.LeasedShare = 0
	s := Size(p)
	if s.CoordinatorGroups != 0 || s.CoordinatorNodes != 0 || s.RenewRequests != 0 {
		t.Errorf("leased share 0: coordinator groups, nodes, renewals = %d, %d, %v, want 0, 0, 0",
			s.CoordinatorGroups, s.CoordinatorNodes, s.RenewRequests)
	}
	if s.RedisShards != 15 { // 1e6 x 10 µs = 10 cores / 0.7 = 14.3
		t.Errorf("leased share 0: RedisShards = %d, want 15", s.RedisShards)
	}

	// Everything leased: no Redis.
	p = testPlan()
	p.LeasedShare = 1
	if s := Size(p); s.RedisShards != 0 || s.RedisCores != 0 {
		t.Errorf("leased share 1: RedisShards, RedisCores = %d, %v, want 0, 0", s.RedisShards, s.RedisCores)
	}

	// Exactly a whole number of shards: 7 cores at 70% is 10 shards, not
	// 11 from floating-point noise.
	p = testPlan()
	p.Decisions, p.LeasedShare, p.RedisUS = 700000, 0, 10
	if s := Size(p); s.RedisShards != 10 {
		t.Errorf("7 cores at 70%% busy: RedisShards = %d, want 10", s.RedisShards)
	}

	// No headroom: the leader may be 100% busy.
	p = testPlan()
	p.Headroom = 0
	p.Gateways = 5000 // 1000 Renew/s x 1.9 ms = 1.9 groups
	if s := Size(p); s.CoordinatorGroups != 2 || s.CoordinatorNodes != 6 {
		t.Errorf("5000 gateways: groups, nodes = %d, %d, want 2, 6", s.CoordinatorGroups, s.CoordinatorNodes)
	}
}

func TestPlanCheck(t *testing.T) {
	if err := testPlan().Check(); err != nil {
		t.Fatalf("testPlan().Check() = %v, want nil", err)
	}
	if err := DefaultPlan().Check(); err != nil {
		t.Fatalf("DefaultPlan().Check() = %v, want nil", err)
	}
	p := testPlan()
	p.Decisions = math.NaN()
	p.LeasedShare = 1.5
	p.Gateways = 0
	p.Headroom = 1
	p.RenewAt = 1
	p.RedisUS = 0
	p.ScriptUS = -1
	p.HoldersPerQuota = -1
	err := p.Check()
	if err == nil {
		t.Fatal("Check() of a bad plan = nil, want errors")
	}
	for _, flag := range []string{"-decisions", "-leased-share", "-gateways", "-headroom", "-renew-at", "-redis-us", "-script-us", "-holders-per-quota"} {
		if !strings.Contains(err.Error(), flag) {
			t.Errorf("Check() = %q, does not name %s", err, flag)
		}
	}

	p = testPlan()
	p.HotQuotas = 0
	if err := p.Check(); err == nil || !strings.Contains(err.Error(), "-hot-quotas") {
		t.Errorf("hot quotas 0 with leased share 0.2: Check() = %v, want a -hot-quotas error", err)
	}
	p.LeasedShare = 0
	if err := p.Check(); err != nil {
		t.Errorf("hot quotas 0 with nothing leased: Check() = %v, want nil", err)
	}
}

func TestRunPlan(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"plan", "-decisions", "1000000", "-leased-share", "0.2", "-gateways", "200",
		"-lease-period", "10s", "-headroom", "0.3", "-redis-us", "10", "-agent-us", "40", "-agent-leased-us", "20",
		"-renew-rps", "1000", "-renew-item-us", "100"}
	if err := run(t.Context(), args, &out, &errOut); err != nil {
		t.Fatalf("run(plan) = %v; stderr %s", err, errOut.String())
	}
	for _, want := range []string{"12 shards", "1 group(s) of 3 nodes", "40.0 Renew/s", "400 leases/s", "1,000,000 decisions/s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan output lacks %q:\n%s", want, out.String())
		}
	}

	if strings.Contains(out.String(), "note:") {
		t.Errorf("plan at the measured rate per agent prints a note:\n%s", out.String())
	}

	out.Reset()
	if err := run(t.Context(), append(args, "-json"), &out, &errOut); err != nil {
		t.Fatalf("run(plan -json) = %v", err)
	}
	var s Sizing
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		t.Fatalf("plan -json: %v\n%s", err, out.String())
	}
	if s.RedisShards != 12 || s.Plan.Gateways != 200 {
		t.Errorf("plan -json: redis_shards, gateways = %d, %d, want 12, 200", s.RedisShards, s.Plan.Gateways)
	}

	out.Reset()
	if err := run(t.Context(), []string{"plan", "-gateways", "20"}, &out, &errOut); err != nil {
		t.Fatalf("run(plan -gateways 20) = %v", err)
	}
	if !strings.Contains(out.String(), "note: 50,000/s per gateway is far from") {
		t.Errorf("plan with 50,000/s per gateway does not note the measured rate:\n%s", out.String())
	}

	err := run(t.Context(), []string{"plan", "-gateways", "0", "-headroom", "2"}, &out, &errOut)
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "-gateways") || !strings.Contains(err.Error(), "-headroom") {
		t.Errorf("plan -gateways 0 -headroom 2: err = %v, want a usage error naming both", err)
	}
	if got := exitCode(err); got != 2 {
		t.Errorf("exitCode(%v) = %d, want 2", err, got)
	}
}

func TestCommas(t *testing.T) {
	for _, c := range []struct {
		in   float64
		want string
	}{{0, "0"}, {999, "999"}, {1000, "1,000"}, {1234567.4, "1,234,567"}, {-12345, "-12,345"}} {
		if got := commas(c.in); got != c.want {
			t.Errorf("commas(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}
