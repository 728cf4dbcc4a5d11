package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// Plan is a capacity question: a traffic mix and the per-decision costs
// that scripts/bench.sh measured (docs/performance.md, "Per-decision costs
// for the capacity plan"). docs/capacity.md explains every formula in
// Size.
type Plan struct {
	// The traffic mix.
	Decisions   float64 `json:"decisions_per_s"` // aggregate decisions per second
	LeasedShare float64 `json:"leased_share"`    // share of decisions on mode: leased rules, in [0, 1]
	Gateways    int     `json:"gateways"`        // gateway instances, one agent each
	HotQuotas   int     `json:"hot_quotas"`      // leased quotas one agent holds at once: items per Renew
	// HoldersPerQuota is how many agents hold a lease of one quota at once
	// (a hot key is hot on every gateway); 0 means all the gateways.
	HoldersPerQuota int           `json:"holders_per_quota"`
	LeasePeriod     time.Duration `json:"lease_period_ns"` // rule lease.period D
	RenewAt         float64       `json:"renew_at"`        // the agent's renew point, a fraction of the lease's validity
	Headroom        float64       `json:"headroom"`        // share of every resource left idle at the target load, in [0, 1)
	GroupSize       int           `json:"group_size"`      // coordinator nodes per Raft group

	// Per-decision costs, measured.
	RedisUS       float64 `json:"redis_us"`        // redis-server CPU µs per script (one shard = one core)
	AgentUS       float64 `json:"agent_us"`        // agent CPU µs per Redis-path decision
	AgentLeasedUS float64 `json:"agent_leased_us"` // agent CPU µs per leased decision
	// AgentRate is the decisions/s per agent AgentUS and AgentLeasedUS were
	// measured at: an agent's CPU per decision falls as its rate rises
	// (calls share wake-ups and syscalls), so they hold near that rate.
	AgentRate   float64 `json:"agent_rate"`
	RenewRPS    float64 `json:"renew_rps"`     // Renew requests/s one group commits (one lease each)
	RenewItemUS float64 `json:"renew_item_us"` // µs per further lease in a Renew (quota with 2 holders)
	// RenewHolderUS is what each further holder of a quota adds to renewing
	// one lease of it, taken as linear: the fair share is read from the
	// quota's aggregates in O(log n) of its holders, so it is small.
	RenewHolderUS float64 `json:"renew_holder_us"`

	// Latency parts at a light load, µs.
	GRPCP99US     float64 `json:"grpc_p99_us"`      // empty unary call
	RedisRTTP99US float64 `json:"redis_rtt_p99_us"` // EVALSHA from one client
	ScriptUS      float64 `json:"script_us"`        // the script inside Redis (mean)
	AllowP99US    float64 `json:"allow_p99_us"`     // unary Allow, Redis path
	LeasedP99US   float64 `json:"leased_p99_us"`    // unary Allow, leased
}

// measured holds the defaults of the per-decision costs: the figures of the
// scripts/bench.sh run recorded in docs/performance.md (2026-12-01 06:43 UTC, code
// c3c17d3, 2 shared CPUs, load average 0.92 at the start and 2.73 at the
// end), whose section "Per-decision costs for the capacity plan" names the
// row or benchmark each one comes from. Re-measure on the target hardware
// and pass the flags that section prints.
var measured = Plan{
	RedisUS:       30.9,  // redis-server CPU per script, redis-benchmark P1, 64 clients
	AgentUS:       156.8, // agent CPU per decision, unary Allow at -agent-rate
	AgentLeasedUS: 153.6, // agent CPU per decision, leased unary Allow at -agent-rate
	AgentRate:     5000,  // open-loop rate of the two rows above
	RenewRPS:      7144,  // coordinator BenchmarkRenew/holders=128, 3 nodes
	RenewItemUS:   1.16,  // lease BenchmarkRenew/items=100/others=1, ns/op / 100
	RenewHolderUS: 0.013, // lease BenchmarkRenew others=100 less others=1, ns/op / 100 / 99
	GRPCP99US:     2077,  // empty unary at 1000/s
	RedisRTTP99US: 135,   // redis-benchmark -c 1 -P 1
	ScriptUS:      18.88, // INFO commandstats usec_per_call of evalsha
	AllowP99US:    3660,  // unary Allow (Redis path) at 1000/s
	LeasedP99US:   2013,  // unary Allow (leased) at 1000/s
}

// DefaultPlan is the capacity question Ration is built for: one million decisions per second,
// a fifth of them leased, 200 gateways, 10s leases, 30% headroom.
func DefaultPlan() Plan {
	p := measured
	p.Decisions = 1e6
	p.LeasedShare = 0.2
	p.Gateways = 200
	p.HotQuotas = 10
	p.LeasePeriod = 10 * time.Second
	p.RenewAt = 0.5
	p.Headroom = 0.3
	p.GroupSize = 3
	return p
}

// Check reports every problem with p at once.
func (p Plan) Check() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	if !(p.Decisions > 0) || !finite(p.Decisions) {
		add("-decisions %v: must be a finite number > 0", p.Decisions)
	}
	if !(p.LeasedShare >= 0 && p.LeasedShare <= 1) {
		add("-leased-share %v: want 0 to 1", p.LeasedShare)
	}
	if p.Gateways < 1 {
		add("-gateways %d: want at least 1", p.Gateways)
	}
	if p.HoldersPerQuota < 0 {
		add("-holders-per-quota %d: must not be negative (0: all the gateways)", p.HoldersPerQuota)
	}
	if p.HotQuotas < 0 {
		add("-hot-quotas %d: must not be negative", p.HotQuotas)
	}
	if p.LeasedShare > 0 && p.HotQuotas == 0 {
		add("-hot-quotas 0 with -leased-share %v: leased decisions need at least one leased quota per agent", p.LeasedShare)
	}
	if p.LeasePeriod <= 0 {
		add("-lease-period %v: must be positive", p.LeasePeriod)
	}
	if !(p.RenewAt > 0 && p.RenewAt < 1) {
		add("-renew-at %v: want a fraction in (0, 1)", p.RenewAt)
	}
	if !(p.Headroom >= 0 && p.Headroom < 1) {
		add("-headroom %v: want 0 to below 1 (the share left idle)", p.Headroom)
	}
	if p.GroupSize < 1 {
		add("-group-size %d: want at least 1 (3 or 5 in production)", p.GroupSize)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"-redis-us", p.RedisUS}, {"-agent-us", p.AgentUS}, {"-agent-leased-us", p.AgentLeasedUS},
		{"-agent-rate", p.AgentRate}, {"-renew-rps", p.RenewRPS},
	} {
		if !(f.v > 0) || !finite(f.v) {
			add("%s %v: must be a finite number > 0 (a measured figure)", f.name, f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"-renew-item-us", p.RenewItemUS}, {"-renew-holder-us", p.RenewHolderUS}, {"-grpc-p99-us", p.GRPCP99US}, {"-redis-rtt-p99-us", p.RedisRTTP99US},
		{"-script-us", p.ScriptUS}, {"-allow-p99-us", p.AllowP99US}, {"-leased-p99-us", p.LeasedP99US},
	} {
		if !(f.v >= 0) || !finite(f.v) {
			add("%s %v: must be a finite number >= 0", f.name, f.v)
		}
	}
	return errors.Join(errs...)
}

// Sizing is Size's answer.
type Sizing struct {
	Plan Plan `json:"plan"`

	RedisDecisions  float64 `json:"redis_decisions_per_s"`
	LeasedDecisions float64 `json:"leased_decisions_per_s"`
	PerGateway      float64 `json:"decisions_per_s_per_gateway"`

	// Redis: script work in cores, and primaries (shards) so that none is
	// busier than 1 - headroom.
	RedisCores    float64 `json:"redis_cores"`
	RedisShards   int     `json:"redis_shards"`
	PerShard      float64 `json:"decisions_per_s_per_shard"`
	ShardCapacity float64 `json:"shard_capacity_decisions_per_s"` // at 1 - headroom busy

	// Agents: CPU at the target load, and provisioned with headroom.
	AgentCores           float64 `json:"agent_cores"`
	AgentCoresWithRoom   float64 `json:"agent_cores_with_headroom"`
	AgentCoresPerGateway float64 `json:"agent_cores_per_gateway"`

	// Coordinator: Renew requests (one per agent per renew point, carrying
	// all its leases) and the share of one group's measured capacity.
	RenewInterval     time.Duration `json:"renew_interval_ns"`
	RenewRequests     float64       `json:"renew_requests_per_s"`
	RenewItems        float64       `json:"renewed_leases_per_s"`
	Holders           int           `json:"holders_per_quota"` // as used: -holders-per-quota or all gateways
	RequestUS         float64       `json:"renew_request_us"`  // one Renew's cost in µs of one group's capacity
	LeaderLoad        float64       `json:"leader_load"`       // of one group, 1 = its measured capacity
	CoordinatorGroups int           `json:"coordinator_groups"`
	CoordinatorNodes  int           `json:"coordinator_nodes"`
	// MaxGatewaysPerGroup is how many agents one group carries at the
	// headroom with this lease period and quota count.
	MaxGatewaysPerGroup int `json:"max_gateways_per_group"`
	// MinLeasePeriod is the shortest lease period with which one group
	// carries all the gateways at the headroom (0 when nothing is leased).
	MinLeasePeriod time.Duration `json:"min_lease_period_ns"`

	// AgentRestUS is what is left of the Redis-path p99 after the gRPC hop
	// and the Redis round trip; negative when the parts' p99s add up to
	// more than the whole's (percentiles do not add).
	AgentRestUS float64 `json:"agent_rest_us"`
}

// Size answers p (which must pass Check).
func Size(p Plan) Sizing {
	s := Sizing{Plan: p}
	busy := 1 - p.Headroom // the most any unit may be busy
	s.LeasedDecisions = p.Decisions * p.LeasedShare
	s.RedisDecisions = p.Decisions - s.LeasedDecisions
	s.PerGateway = p.Decisions / float64(p.Gateways)

	s.RedisCores = s.RedisDecisions * p.RedisUS / 1e6
	s.ShardCapacity = busy * 1e6 / p.RedisUS
	if s.RedisDecisions > 0 {
		s.RedisShards = ceil(s.RedisCores / busy)
		s.PerShard = s.RedisDecisions / float64(s.RedisShards)
	}

	s.AgentCores = (s.RedisDecisions*p.AgentUS + s.LeasedDecisions*p.AgentLeasedUS) / 1e6
	s.AgentCoresWithRoom = s.AgentCores / busy
	s.AgentCoresPerGateway = s.AgentCoresWithRoom / float64(p.Gateways)

	// The agent renews all its leases in one Renew at the renew point of
	// their validity; validity is the lease period less the drift and
	// pause allowances, close enough to the period for sizing (a shorter
	// validity means slightly more renewals: see docs/capacity.md).
	s.RenewInterval = time.Duration(float64(p.LeasePeriod) * p.RenewAt)
	if s.LeasedDecisions > 0 {
		s.RenewRequests = float64(p.Gateways) / s.RenewInterval.Seconds()
		s.RenewItems = s.RenewRequests * float64(p.HotQuotas)
		perRequest := requestCost(p) // seconds of one group's capacity
		s.RequestUS = perRequest * 1e6
		s.Holders = holders(p)
		s.LeaderLoad = s.RenewRequests * perRequest
		s.CoordinatorGroups = max(1, ceil(s.LeaderLoad/busy))
		s.MaxGatewaysPerGroup = maxGateways(p, busy, s.RenewInterval.Seconds())
		// Load scales as 1/period: the period that brings it to busy.
		s.MinLeasePeriod = time.Duration(float64(p.LeasePeriod) * s.LeaderLoad / busy).Round(time.Second / 10)
	} else {
		s.CoordinatorGroups = 0
	}
	s.CoordinatorNodes = s.CoordinatorGroups * p.GroupSize
	s.AgentRestUS = p.AllowP99US - p.GRPCP99US - p.RedisRTTP99US
	return s
}

// requestCost is the share of one group's capacity (in seconds) one Renew
// of p.HotQuotas leases takes: a one-lease request costs 1/RenewRPS as
// measured (its quota has one holder), each further lease RenewItemUS, and
// every lease RenewHolderUS per holder of its quota beyond the first.
func requestCost(p Plan) float64 {
	q := float64(p.HotQuotas)
	return 1/p.RenewRPS + (max(0, q-1)*p.RenewItemUS+q*float64(holders(p)-1)*p.RenewHolderUS)/1e6
}

// maxGateways is the most agents whose renewals keep one group at most
// busy: the load grows with the gateways and, when every gateway holds
// every quota, with the holders per quota too (so faster than linearly),
// hence a search rather than a division.
func maxGateways(p Plan, busy, interval float64) int {
	load := func(g int) float64 {
		q := p
		q.Gateways = g
		return float64(g) / interval * requestCost(q)
	}
	lo, hi := 0, 1 // load(lo) <= busy < load(hi)
	for load(hi) <= busy {
		lo, hi = hi, hi*2
		if hi > 1<<40 {
			return lo
		}
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if load(mid) <= busy {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// holders is how many agents share one quota.
func holders(p Plan) int {
	if p.HoldersPerQuota > 0 {
		return min(p.HoldersPerQuota, p.Gateways)
	}
	return p.Gateways
}

// ceil rounds x up to an integer, treating a tiny excess over a whole
// number (floating-point noise) as that number.
func ceil(x float64) int {
	return int(math.Ceil(x - 1e-9))
}

// writeText prints s for a terminal.
func (s Sizing) writeText(w io.Writer) error {
	p := s.Plan
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	pct := func(f float64) string { return fmt.Sprintf("%.0f%%", 100*f) }
	fmt.Fprintf(tw, "traffic\t%s decisions/s: %s on the Redis path, %s leased (%s); %d gateways, %s/s each\n",
		commas(p.Decisions), commas(s.RedisDecisions), commas(s.LeasedDecisions), pct(p.LeasedShare), p.Gateways, commas(s.PerGateway))
	fmt.Fprintf(tw, "headroom\t%s: no Redis shard, agent or coordinator group above %s busy at the target load\n", pct(p.Headroom), pct(1-p.Headroom))
	fmt.Fprintln(tw, "\t")
	if s.RedisShards > 0 {
		fmt.Fprintf(tw, "Redis\t%d shards (primaries; one core each), plus a replica each for failover\n", s.RedisShards)
		fmt.Fprintf(tw, "\t%s scripts/s x %.1f µs = %.2f cores of script work; a shard carries %s/s at %s busy; %s/s each\n",
			commas(s.RedisDecisions), p.RedisUS, s.RedisCores, commas(s.ShardCapacity), pct(1-p.Headroom), commas(s.PerShard))
		fmt.Fprintf(tw, "\tone key lives on one shard: no Redis-path key may take more than %s/s (lease hotter keys)\n", commas(s.ShardCapacity))
	} else {
		fmt.Fprintf(tw, "Redis\tnone needed: every decision is leased\n")
	}
	fmt.Fprintf(tw, "agents\t%.1f cores in all with headroom (%.2f at the target load), %.2f per gateway\n",
		s.AgentCoresWithRoom, s.AgentCores, s.AgentCoresPerGateway)
	fmt.Fprintf(tw, "\t%s x %.1f µs (Redis path) + %s x %.1f µs (leased), costs measured at %s/s per agent\n",
		commas(s.RedisDecisions), p.AgentUS, commas(s.LeasedDecisions), p.AgentLeasedUS, commas(p.AgentRate))
	if r := s.PerGateway / p.AgentRate; r > 2 || r < 0.5 {
		fmt.Fprintf(tw, "\tnote: %s/s per gateway is far from %s/s: measure the agent at that rate (scripts/bench.sh BENCH_GATEWAY_RATE)\n",
			commas(s.PerGateway), commas(p.AgentRate))
	}
	if s.CoordinatorGroups > 0 {
		fmt.Fprintf(tw, "coordinator\t%d group(s) of %d nodes = %d nodes; each group at %s of its measured capacity\n",
			s.CoordinatorGroups, p.GroupSize, s.CoordinatorNodes, pct(s.LeaderLoad))
		fmt.Fprintf(tw, "\t%d gateways / (%v x %.2f renew point) = %.1f Renew/s, carrying %s leases/s (%d each)\n",
			p.Gateways, p.LeasePeriod, p.RenewAt, s.RenewRequests, commas(s.RenewItems), p.HotQuotas)
		fmt.Fprintf(tw, "\tone group carries %d gateways at this period; its throughput carries all %d from a period of %v\n",
			s.MaxGatewaysPerGroup, p.Gateways, s.MinLeasePeriod)
		if s.CoordinatorGroups > 1 {
			fmt.Fprintf(tw, "\ta region has one group: split the gateways into %d regions, or lengthen the lease period\n", s.CoordinatorGroups)
		}
		fmt.Fprintf(tw, "\tone Renew costs %.0f µs of the group: %d leases, each quota held by %d agents (fair share over them)\n",
			s.RequestUS, p.HotQuotas, s.Holders)
		fmt.Fprintf(tw, "\trenewals grow with gateways / period, not with decisions/s\n")
	} else {
		fmt.Fprintf(tw, "coordinator\tnone needed: nothing is leased\n")
	}
	fmt.Fprintln(tw, "\t")
	fmt.Fprintf(tw, "p99 budget\tRedis-path Allow %.0f µs at a light load: gRPC hop %.0f (empty call p99) + Redis round trip %.0f (EVALSHA p99; script %.1f µs mean)",
		p.AllowP99US, p.GRPCP99US, p.RedisRTTP99US, p.ScriptUS)
	if s.AgentRestUS >= 0 {
		fmt.Fprintf(tw, " + agent and queueing %.0f\n", s.AgentRestUS)
	} else {
		fmt.Fprintf(tw, " (the parts' p99s add up to more: they rarely peak together)\n")
	}
	fmt.Fprintf(tw, "\tleased Allow %.0f µs: the gRPC hop and nothing else on the network\n", p.LeasedP99US)
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// commas formats a rate rounded to an integer with thousands separators.
func commas(v float64) string {
	n := int64(math.Round(v))
	neg := n < 0
	if neg {
		n = -n
	}
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

const planUsage = `ration-bench plan sizes a deployment for a decision rate and traffic mix
from per-decision costs measured by scripts/bench.sh (docs/capacity.md).

Usage:
  ration-bench plan [flags]

Example:
  ration-bench plan -decisions 1000000 -leased-share 0.2 -gateways 200 -lease-period 10s -headroom 0.3

The cost flags default to the run recorded in docs/performance.md; its
section "Per-decision costs for the capacity plan" prints the flags of a
new run (make bench).

Flags:
`

// runPlan is the plan subcommand.
func runPlan(args []string, stdout, stderr io.Writer) error {
	p := DefaultPlan()
	fs := flag.NewFlagSet("ration-bench plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), planUsage)
		fs.PrintDefaults()
	}
	var asJSON bool
	fs.Float64Var(&p.Decisions, "decisions", p.Decisions, "aggregate decisions per second to size for")
	fs.Float64Var(&p.LeasedShare, "leased-share", p.LeasedShare, "share of decisions on mode: leased rules (hot keys, global quotas), 0 to 1")
	fs.IntVar(&p.Gateways, "gateways", p.Gateways, "gateway instances, one agent each")
	fs.IntVar(&p.HotQuotas, "hot-quotas", p.HotQuotas, "leased quotas (rule, subject) one agent holds at once: leases per Renew")
	fs.DurationVar(&p.LeasePeriod, "lease-period", p.LeasePeriod, "lease period D of the leased rules (rule lease.period)")
	fs.Float64Var(&p.RenewAt, "renew-at", p.RenewAt, "the agent's renew point: fraction of a lease's validity (holder default 0.5)")
	fs.Float64Var(&p.Headroom, "headroom", p.Headroom, "share of every resource left idle at the target load, 0 to below 1")
	fs.IntVar(&p.GroupSize, "group-size", p.GroupSize, "coordinator nodes per Raft group (3 or 5)")
	fs.Float64Var(&p.RedisUS, "redis-us", p.RedisUS, "redis-server CPU µs per script (measured: redis-benchmark P1)")
	fs.Float64Var(&p.AgentUS, "agent-us", p.AgentUS, "agent CPU µs per Redis-path decision (measured: unary Allow)")
	fs.Float64Var(&p.AgentLeasedUS, "agent-leased-us", p.AgentLeasedUS, "agent CPU µs per leased decision (measured: leased unary Allow)")
	fs.Float64Var(&p.AgentRate, "agent-rate", p.AgentRate, "decisions/s per agent at which -agent-us and -agent-leased-us were measured")
	fs.Float64Var(&p.RenewRPS, "renew-rps", p.RenewRPS, "Renew requests/s one coordinator group commits (measured: BenchmarkRenew/holders=128)")
	fs.IntVar(&p.HoldersPerQuota, "holders-per-quota", p.HoldersPerQuota, "agents holding a lease of one quota at once (0: all the gateways)")
	fs.Float64Var(&p.RenewItemUS, "renew-item-us", p.RenewItemUS, "µs per further lease in a Renew (measured: internal/lease BenchmarkRenew/items=100/others=1)")
	fs.Float64Var(&p.RenewHolderUS, "renew-holder-us", p.RenewHolderUS, "µs each further holder of its quota adds to one lease's renewal (measured: internal/lease BenchmarkRenew, others=100 vs 1)")
	fs.Float64Var(&p.GRPCP99US, "grpc-p99-us", p.GRPCP99US, "p99 µs of the empty unary gRPC call at a light load")
	fs.Float64Var(&p.RedisRTTP99US, "redis-rtt-p99-us", p.RedisRTTP99US, "p99 µs of EVALSHA from one client, unpipelined")
	fs.Float64Var(&p.ScriptUS, "script-us", p.ScriptUS, "mean µs the script runs inside Redis (INFO commandstats)")
	fs.Float64Var(&p.AllowP99US, "allow-p99-us", p.AllowP99US, "p99 µs of a Redis-path unary Allow at a light load")
	fs.Float64Var(&p.LeasedP99US, "leased-p99-us", p.LeasedP99US, "p99 µs of a leased unary Allow at a light load")
	fs.BoolVar(&asJSON, "json", false, "print the sizing as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("plan: unexpected arguments %q (flags only; see -h)", fs.Args())}
	}
	if err := p.Check(); err != nil {
		return usageError{err}
	}
	s := Size(p)
	if asJSON {
		e := json.NewEncoder(stdout)
		e.SetIndent("", "  ")
		return e.Encode(s)
	}
	return s.writeText(stdout)
}
