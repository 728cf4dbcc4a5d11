package sim

import (
	"errors"
	"fmt"
	"time"
)

// Config is one simulation. Small and Reference are the two that make
// targets run; every field is checked by Validate.
type Config struct {
	Name string
	Seed uint64

	Regions         int
	AgentsPerRegion int
	// Duration is simulated time; Step is how often each agent's
	// decisions are made (all of one step's at the step's instant).
	Duration, Step time.Duration
	// Rate is the offered decisions per second, all regions together, on
	// average over the run: the diurnal wave swings between 0.75 and 1.25
	// of it.
	Rate float64
	// HotSubjects is how many subjects the hot rule has per region, drawn
	// by a Zipf law of exponent Zipf.
	HotSubjects int
	Zipf        float64
	// The traffic mix: the fractions of requests for the global rule and
	// for the region's own rule; the rest goes to hot subjects.
	GlobalShare, RegionalShare float64
	// Limits as a fraction of the mean demand they face, so that quotas are
	// contended at the top of the wave and not at its bottom.
	GlobalLimit, RegionalLimit, HotLimit float64
	// BurstSeconds sizes every quota's burst: rate x BurstSeconds.
	BurstSeconds float64

	LeasePeriod  time.Duration
	SafetyMargin time.Duration
	TickInterval time.Duration // the leader's Tick
	UpstreamTick time.Duration // a regional leader's upstream loop
	HolderTick   time.Duration // an agent's renewal loop (holder.Options.Tick)

	// AgentDrift and CoordDrift bound the clock-rate drift of agents and
	// coordinator nodes (each draws its own in [-d, d]); CoordOffset bounds
	// a coordinator node's clock offset (within the safety margin).
	AgentDrift, CoordDrift float64
	CoordOffset            time.Duration

	// Network: one-way latency within a region (base plus an exponential
	// jitter), between regions (a base per pair drawn in [CrossMin,
	// CrossMax], plus jitter), and the probabilities of losing,
	// duplicating and delaying a message by Spike (reordering it).
	LocalBase, LocalJitter time.Duration
	CrossMin, CrossMax     time.Duration
	CrossJitter            time.Duration
	Loss, Dup, Reorder     float64
	Spike                  time.Duration
	// ElectionTimeout is how long a group is without a leader after it
	// lost one (plus up to as much again, drawn).
	ElectionTimeout time.Duration

	// Faults injects the fault schedule (Schedule); off, only loss,
	// duplication, reordering and drift.
	Faults bool
	// Nudges models the regional leaders' nudge planner
	// (coordinator.PlanQuota) and their Watch streams; off, holders renew
	// at their renew points and when they run dry, and follow times are
	// upper bounds. Off by default: with it, under the contention these
	// runs have, regional groups see several times the Renew requests
	// (docs/scale.md), and a reference run takes that much longer.
	Nudges bool
	// Warmup is left out of utilisation (leases being granted).
	Warmup time.Duration
}

// Small runs in seconds: make sim-small, and make test.
func Small() Config {
	c := Reference()
	c.Name = "small"
	c.Regions, c.AgentsPerRegion = 4, 25
	c.Rate = 20_000
	c.HotSubjects = 6
	// Faults come every few seconds here: shorter leases recover between
	// them (each fault is followed by a lease period of settling).
	c.Duration = 2 * time.Minute
	c.LeasePeriod = 3 * time.Second
	c.Warmup = 6 * time.Second
	return c
}

// Reference is the reference run: 20 regions, 10,000 agents, 1,000,000
// decisions per second on average (1,250,000 at the top of the wave), 10
// minutes.
func Reference() Config {
	return Config{
		Name:            "reference",
		Seed:            1,
		Regions:         20,
		AgentsPerRegion: 500,
		Duration:        10 * time.Minute,
		// Decisions at 100ms instants: each agent makes about ten per
		// step (1,000,000/s over 10,000 agents), so its holder is visited
		// warm; windows are judged at those instants.
		Step:            100 * time.Millisecond,
		Rate:            1_000_000,
		HotSubjects:     4,
		Zipf:            1.0,
		GlobalShare:     0.3,
		RegionalShare:   0.3,
		GlobalLimit:     0.8,
		RegionalLimit:   0.5,
		HotLimit:        0.9,
		BurstSeconds:    1,
		LeasePeriod:     10 * time.Second,
		SafetyMargin:    time.Second,
		TickInterval:    500 * time.Millisecond,
		UpstreamTick:    20 * time.Millisecond,
		HolderTick:      20 * time.Millisecond,
		AgentDrift:      0.0005,
		CoordDrift:      0.0001,
		CoordOffset:     100 * time.Millisecond,
		LocalBase:       200 * time.Microsecond,
		LocalJitter:     300 * time.Microsecond,
		CrossMin:        15 * time.Millisecond,
		CrossMax:        120 * time.Millisecond,
		CrossJitter:     2 * time.Millisecond,
		Loss:            0.001,
		Dup:             0.001,
		Reorder:         0.002,
		Spike:           30 * time.Millisecond,
		ElectionTimeout: time.Second,
		Faults:          true,
		Warmup:          20 * time.Second,
	}
}

// Validate says what is wrong with c, every problem at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Regions < 3 || c.Regions > 100 {
		bad("regions %d: must be in [3, 100] (the global group has a node in each of the first three)", c.Regions)
	}
	if c.AgentsPerRegion < 1 || c.AgentsPerRegion > 10_000 {
		bad("agents per region %d: must be in [1, 10000]", c.AgentsPerRegion)
	}
	if c.Step <= 0 || c.Duration < 10*c.Step {
		bad("duration %v and step %v: need step > 0 and at least 10 steps", c.Duration, c.Step)
	}
	if !(c.Rate > 0) || c.Rate > 1e8 {
		bad("rate %v: must be in (0, 1e8]", c.Rate)
	}
	if c.HotSubjects < 1 || c.HotSubjects > 1000 {
		bad("hot subjects %d: must be in [1, 1000]", c.HotSubjects)
	}
	if !(c.Zipf > 0) {
		bad("zipf exponent %v: must be > 0", c.Zipf)
	}
	if c.GlobalShare < 0 || c.RegionalShare < 0 || c.GlobalShare+c.RegionalShare >= 1 {
		bad("global share %v and regional share %v: must be >= 0 and sum below 1", c.GlobalShare, c.RegionalShare)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"global limit", c.GlobalLimit}, {"regional limit", c.RegionalLimit}, {"hot limit", c.HotLimit}, {"burst seconds", c.BurstSeconds}} {
		if !(f.v > 0) {
			bad("%s %v: must be > 0", f.name, f.v)
		}
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"lease period", c.LeasePeriod}, {"tick interval", c.TickInterval}, {"upstream tick", c.UpstreamTick}, {"holder tick", c.HolderTick}, {"election timeout", c.ElectionTimeout}} {
		if f.d <= 0 {
			bad("%s %v: must be > 0", f.name, f.d)
		}
	}
	if c.AgentDrift < 0 || c.AgentDrift+c.CoordDrift >= 0.001 || c.CoordDrift < 0 {
		bad("agent drift %v + coordinator drift %v: must be within the holders' assumed bound 0.001", c.AgentDrift, c.CoordDrift)
	}
	if c.CoordOffset < 0 || 2*c.CoordOffset > c.SafetyMargin {
		bad("coordinator clock offset %v: twice it must be within the safety margin %v", c.CoordOffset, c.SafetyMargin)
	}
	if c.CrossMin < 0 || c.CrossMax < c.CrossMin {
		bad("cross-region latency [%v, %v]: not a range", c.CrossMin, c.CrossMax)
	}
	for _, f := range []struct {
		name string
		p    float64
	}{{"loss", c.Loss}, {"dup", c.Dup}, {"reorder", c.Reorder}} {
		if f.p < 0 || f.p >= 0.5 {
			bad("%s probability %v: must be in [0, 0.5)", f.name, f.p)
		}
	}
	if c.Warmup < 0 || c.Warmup >= c.Duration {
		bad("warmup %v: must be in [0, duration)", c.Warmup)
	}
	return errors.Join(errs...)
}
