package sim

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/region"
	"github.com/ration-dev/ration/internal/rules"
)

// Rule names of the simulated rule set.
const (
	ruleGlobal   = "global-api"   // scope global: global group -> regions -> agents
	ruleRegional = "regional-api" // one quota per region
	ruleHot      = "hot"          // one quota per (region, subject), Zipf demand
)

// spec is one leased quota: its shape and where its admissions are
// recorded.
type spec struct {
	id          string
	global      bool
	region      int
	burst, rate float64
	key         int
}

// pick is one quota an agent's requests go to, with the probability of a
// request going to it.
type pick struct {
	rule    *rules.Rule
	subject string
	key     int
	global  bool
	p       float64
}

// Sim is one run. Build it with New, run it with Run.
type Sim struct {
	cfg   Config
	rng   *rand.Rand
	now   int64
	end   int64
	seq   uint64
	queue eventQueue

	cross      [][]int64
	partitions []partition

	groups   []*group
	global   *group
	agents   []*agent
	byRegion [][]*agent
	weights  []float64 // each region's part of the demand
	specs    map[string]*spec
	keys     []*spec

	rules       map[string]*rules.Rule
	agentQuotas [][]pick
	// flash, dark: demand changes in force (fault schedule).
	dark   []bool
	flash  []int // per region: the hot subject in a flash crowd, -1: none
	faults []fault
	rec    *recorder
	// upRates: each region's upstream lease rate of the global rule, per
	// second (the global group's view); darkRef: a dark region's rate just
	// before it went dark.
	upRates [][]float64
	darkRef []float64
	stats   stats
	log     []string
	fails   []string
	nfails  int
	started time.Time
	workers int
	apply   *applier // while Run runs

	// Progress, when set, gets a line per simulated minute (wall-clock
	// figures, so never part of the report).
	Progress io.Writer
}

type stats struct {
	messages, lost, cut, duplicated int64
	rounds, nudges, elections       int64
	decisions, admitted             int64
	crashes                         int64
	// A lost term's uncommitted entries: committed by the next leader,
	// or gone (its log lacked them).
	lostCommitted, lostDropped int64
}

// New builds the run of cfg: its groups, agents, quotas and faults.
func New(cfg Config) (*Sim, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sim %q: %w", cfg.Name, err)
	}
	s := &Sim{workers: runtime.GOMAXPROCS(0), cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x5eed)), end: us(cfg.Duration), specs: map[string]*spec{}, rules: map[string]*rules.Rule{}}
	R := cfg.Regions
	// Cross-region latencies: a base per pair, symmetric.
	s.cross = make([][]int64, R)
	for i := range s.cross {
		s.cross[i] = make([]int64, R)
	}
	for i := 0; i < R; i++ {
		for j := i + 1; j < R; j++ {
			d := us(cfg.CrossMin) + s.rng.Int64N(us(cfg.CrossMax-cfg.CrossMin)+1)
			s.cross[i][j], s.cross[j][i] = d, d
		}
	}
	// Region weights: each region's part of the demand, 0.5 to 1.5 of an
	// even split.
	s.weights = make([]float64, R)
	var sum float64
	for i := range s.weights {
		s.weights[i] = 0.5 + s.rng.Float64()
		sum += s.weights[i]
	}
	for i := range s.weights {
		s.weights[i] /= sum
	}
	s.dark = make([]bool, R)
	s.flash = make([]int, R)
	for i := range s.flash {
		s.flash[i] = -1
	}
	s.buildQuotas()
	s.rec = newRecorder(len(s.keys), int(s.end/us(cfg.Step))+1)
	s.upRates = make([][]float64, R)
	for i := range s.upRates {
		s.upRates[i] = make([]float64, int(s.end/1e6)+1)
	}
	s.darkRef = make([]float64, R)

	// Groups: the global one has a node in each of the first three
	// regions; each region's has three nodes in the region.
	newGroup := func(idx, reg int, name string, nodeRegions [3]int) *group {
		g := &group{s: s, idx: idx, region: reg, name: name, leader: -1, st: lease.New(), isolatedSince: -1, load: newLoad(int(s.end/1e6) + 1)}
		for k, nr := range nodeRegions {
			off := int64(0)
			if cfg.CoordOffset > 0 {
				off = s.rng.Int64N(2*us(cfg.CoordOffset)+1) - us(cfg.CoordOffset)
			}
			g.nodes = append(g.nodes, &cnode{g: g, idx: k, region: nr, alive: true, clock: clock{off: off, drift: (2*s.rng.Float64() - 1) * cfg.CoordDrift}})
		}
		return g
	}
	s.global = newGroup(0, -1, "global", [3]int{0, 1, 2})
	s.groups = append(s.groups, s.global)
	for r := 0; r < R; r++ {
		g := newGroup(1+r, r, "region "+s.regionName(r), [3]int{r, r, r})
		g.up = newUpstream(g)
		s.groups = append(s.groups, g)
	}
	// Agents.
	s.byRegion = make([][]*agent, R)
	for r := 0; r < R; r++ {
		for i := 0; i < cfg.AgentsPerRegion; i++ {
			a := &agent{s: s, idx: len(s.agents), region: r, clock: clock{off: s.rng.Int64N(1e12), drift: (2*s.rng.Float64() - 1) * cfg.AgentDrift}}
			s.agents = append(s.agents, a)
			s.byRegion[r] = append(s.byRegion[r], a)
		}
	}
	if cfg.Faults {
		s.faults = schedule(s)
	}
	return s, nil
}

func (s *Sim) regionName(r int) string {
	if r < 0 {
		return "global"
	}
	return fmt.Sprintf("r%02d", r)
}

// diurnal is the demand's wave around its mean: 0.75 of it at the start
// and end of the run, 1.25 in its middle, 1 on average.
func (s *Sim) diurnal(t int64) float64 {
	return 1 - 0.25*math.Cos(2*math.Pi*float64(t)/float64(s.end))
}

func (s *Sim) buildQuotas() {
	cfg := s.cfg
	mean := cfg.Rate // the wave's mean
	mk := func(name string, rate float64) *rules.Rule {
		r := &rules.Rule{Name: name, Burst: rate * cfg.BurstSeconds, Rate: rate, Mode: rules.ModeLeased, OnFailure: rules.FailClosed, Lease: rules.Lease{Period: cfg.LeasePeriod}}
		s.rules[name] = r
		return r
	}
	add := func(id string, global bool, reg int, rate float64) *spec {
		sp := &spec{id: id, global: global, region: reg, burst: rate * cfg.BurstSeconds, rate: rate, key: len(s.keys)}
		s.specs[id] = sp
		s.keys = append(s.keys, sp)
		return sp
	}
	gRate := cfg.GlobalLimit * cfg.GlobalShare * mean
	gRule := mk(ruleGlobal, gRate)
	gSpec := add(ruleGlobal+"|", true, -1, gRate)
	// The rules' rates are what agents ask a first grant for; the
	// coordinators' quota shapes come from the specs.
	regRule := mk(ruleRegional, cfg.RegionalLimit*cfg.RegionalShare*mean/float64(cfg.Regions))
	hotRule := mk(ruleHot, cfg.HotLimit*(1-cfg.GlobalShare-cfg.RegionalShare)*mean/float64(cfg.Regions*cfg.HotSubjects))
	zipf := make([]float64, cfg.HotSubjects)
	var zs float64
	for k := range zipf {
		zipf[k] = 1 / math.Pow(float64(k+1), cfg.Zipf)
		zs += zipf[k]
	}
	for k := range zipf {
		zipf[k] /= zs
	}
	s.agentQuotas = make([][]pick, cfg.Regions)
	for r := 0; r < cfg.Regions; r++ {
		w := s.weights[r] * mean
		rs := add(ruleRegional+"|"+s.regionName(r), false, r, cfg.RegionalLimit*cfg.RegionalShare*w)
		qs := []pick{
			{rule: gRule, subject: "", key: gSpec.key, global: true, p: cfg.GlobalShare},
			{rule: regRule, subject: s.regionName(r), key: rs.key, p: cfg.RegionalShare},
		}
		hotShare := 1 - cfg.GlobalShare - cfg.RegionalShare
		for k := range zipf {
			subj := fmt.Sprintf("%s-s%d", s.regionName(r), k)
			hs := add(ruleHot+"|"+subj, false, r, cfg.HotLimit*hotShare*w*zipf[k])
			qs = append(qs, pick{rule: hotRule, subject: subj, key: hs.key, p: hotShare * zipf[k]})
		}
		s.agentQuotas[r] = qs
	}
	// One more key per region: its agents' admissions of the global rule
	// (for the plots; the bound is the global quota's).
	for r := 0; r < cfg.Regions; r++ {
		s.keys = append(s.keys, &spec{id: ruleGlobal + "@" + s.regionName(r), region: r, key: len(s.keys)})
	}
}

// regionKey is the key of region r's admissions of the global rule.
func (s *Sim) regionKey(r int) int { return len(s.keys) - s.cfg.Regions + r }

// cumulative is region r's request distribution over its quotas now.
func (s *Sim) cumulative(r int) []float64 {
	qs := s.agentQuotas[r]
	ps := make([]float64, len(qs))
	for i, q := range qs {
		ps[i] = q.p
	}
	if f := s.flash[r]; f >= 0 {
		// A flash crowd: one hot subject takes half of the region's hot
		// traffic on top of what it had.
		hot := 1 - s.cfg.GlobalShare - s.cfg.RegionalShare
		ps[2+f] += hot / 2
	}
	var sum float64
	for i := range ps {
		sum += ps[i]
		ps[i] = sum
	}
	for i := range ps {
		ps[i] /= sum
	}
	return ps
}

// regionRate is region r's offered decisions per second at t.
func (s *Sim) regionRate(r int, t int64) float64 {
	if s.dark[r] {
		return 0
	}
	rate := s.cfg.Rate * s.weights[r] * s.diurnal(t)
	if s.flash[r] >= 0 {
		rate *= 1 + (1-s.cfg.GlobalShare-s.cfg.RegionalShare)/2
	}
	return rate
}

// decide makes one step's decisions on every live agent. Regions are
// independent within a step (each agent's holder is its own, each region
// has its own keys and its own random stream, drawn from the seed, the
// region and the step), so they run on all cores and the run stays exact:
// only the global rule's counts are shared, and they are summed after.
func (s *Sim) decide() {
	k := int(s.now / us(s.cfg.Step))
	R := s.cfg.Regions
	type out struct {
		globalAdm, globalDem int32
		decisions, admitted  int64
		poke                 []*agent
	}
	outs := make([]out, R)
	work := func(r int) {
		o := &outs[r]
		var live []*agent
		for _, a := range s.byRegion[r] {
			if a.alive {
				live = append(live, a)
			}
		}
		if len(live) == 0 {
			return
		}
		rng := rand.New(rand.NewPCG(s.cfg.Seed^(uint64(r+1)*0x9e3779b97f4a7c15), uint64(k)))
		ctx := context.Background()
		lambda := s.regionRate(r, s.now) * s.cfg.Step.Seconds() / float64(len(live))
		cum := s.cumulative(r)
		qs := s.agentQuotas[r]
		rk := s.regionKey(r)
		for _, a := range live {
			n := poisson(rng, lambda)
			if n == 0 {
				continue
			}
			now := a.clock.at(s.now)
			for range n {
				i := sort.SearchFloat64s(cum, rng.Float64())
				if i >= len(qs) {
					i = len(qs) - 1
				}
				q := &qs[i]
				res, ok := a.l.Take(ctx, q.rule, q.subject, 1, now)
				admitted := ok && res.Allowed
				o.decisions++
				if admitted {
					o.admitted++
				}
				if q.global {
					o.globalDem++
					s.rec.demand[rk][k]++
					if admitted {
						o.globalAdm++
						s.rec.admitted[rk][k]++
					}
					continue
				}
				s.rec.demand[q.key][k]++
				if admitted {
					s.rec.admitted[q.key][k]++
				}
			}
			o.poke = append(o.poke, a)
		}
	}
	var wg sync.WaitGroup
	workers := min(R, s.workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := w; r < R; r += workers {
				work(r)
			}
		}()
	}
	wg.Wait()
	gk := s.specs[ruleGlobal+"|"].key
	for r := range outs {
		o := &outs[r]
		s.rec.admitted[gk][k] += o.globalAdm
		s.rec.demand[gk][k] += o.globalDem
		s.stats.decisions += o.decisions
		s.stats.admitted += o.admitted
		for _, a := range o.poke {
			a.poke()
		}
	}
}

// sampleShares records each region's upstream lease rate of the global
// rule as the global group holds it.
func (s *Sim) sampleShares() {
	i := min(int(s.now/1e6), len(s.upRates[0])-1)
	s.apply.drain(s.global)
	for _, l := range s.global.st.Leases(ruleGlobal + "|") {
		if id, ok := region.FromHolder(l.Holder); ok {
			for r := range s.upRates {
				if s.regionName(r) == string(id) {
					s.upRates[r][i] = l.Rate
				}
			}
		}
	}
}

func (s *Sim) logf(format string, args ...any) {
	s.log = append(s.log, fmt.Sprintf("%9.3fs  ", float64(s.now)/1e6)+fmt.Sprintf(format, args...))
}

// fail records a broken invariant; the run goes on, and fails.
func (s *Sim) fail(format string, args ...any) { s.failAt(s.now, format, args...) }

// failAt is fail for what broke at time at.
func (s *Sim) failAt(at int64, format string, args ...any) {
	s.nfails++
	if len(s.fails) < 20 {
		s.fails = append(s.fails, fmt.Sprintf("%9.3fs  ", float64(at)/1e6)+fmt.Sprintf(format, args...))
	}
}

// runUntil runs the events up to time t.
func (s *Sim) runUntil(t int64) {
	for s.queue.Len() > 0 && s.queue[0].at <= t {
		e := s.queue.pop()
		s.now = e.at
		e.fn()
	}
}

// Run runs the simulation to its end and returns its report.
func (s *Sim) Run() (*Report, error) {
	s.started = time.Now()
	s.apply = newApplier()
	defer s.apply.stop() // on an error return; after the loop it is stopped already
	for _, a := range s.agents {
		if err := a.start(); err != nil {
			return nil, err
		}
	}
	for _, g := range s.groups {
		g.elect()
		s.every(us(s.cfg.TickInterval), us(s.cfg.TickInterval), g.tick)
		s.every(100_000, 100_000, g.watch)
		if g.up != nil {
			s.every(us(s.cfg.UpstreamTick), us(s.cfg.UpstreamTick), g.up.round)
		}
		s.every(5_000_000, 5_000_000, func() {
			s.apply.drain(g)
			if err := g.st.CheckInvariants(); err != nil {
				s.fail("%s: state invariants: %v", g.name, err)
			}
		})
	}
	for _, f := range s.faults {
		s.at(f.from, f.start)
		s.at(f.to, f.stop)
	}
	s.every(us(s.cfg.Step), us(s.cfg.Step), s.decide)
	s.every(1e6, 1e6, s.sampleShares)
	if s.Progress != nil {
		s.every(60_000_000, 60_000_000, func() {
			fmt.Fprintf(s.Progress, "ration-sim: %v of %v simulated, %d decisions, wall clock %v\n",
				time.Duration(s.now)*time.Microsecond, s.cfg.Duration, s.stats.decisions, time.Since(s.started).Round(time.Second))
		})
	}
	s.runUntil(s.end)
	for _, a := range s.agents {
		a.crash()
	}
	s.apply.stop()
	return s.report(), nil
}
