package bound

import (
	"cmp"
	"os"
	"slices"
	"time"

	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/rules"
)

// pending is a step the schedule has committed to: the end of a fault.
type pending struct {
	at time.Duration
	do func()
}

// The schedule's kinds of step, with their chances; a step that cannot be
// taken at its turn (its agent is under a fault already, a failover is
// under way) is skipped.
var stepKinds = []struct {
	name   string
	chance float64
}{
	{"reload", 0.15},
	{"leader kill", 0.08},
	{"cut and change", 0.12},
	{"stall", 0.08},
	{"pause", 0.08},
	{"new agent", 0.07},
	{"redis failover", 0.08},
	{"redis clock step", 0.08},
	{"coordinator links reset", 0.07},
	{"coordinator replies dropped", 0.07},
	{"region cut", 0.12},
}

// mustReach are the kinds every run takes at least once: past half the
// run, a kind not yet taken is taken at the next turn.
var mustReach = []string{"leader kill", "stall", "pause", "redis failover", "redis clock step",
	"coordinator links reset", "coordinator replies dropped", "region cut"}

// runSchedule follows the seeded schedule for run, on the test's
// goroutine (the harness's Kill and Restart must be called there): every
// 0.3 to 2 s a step of one of stepKinds (see step). At the end the steps
// still pending are taken in their order, so that every fault is undone.
func (w *world) runSchedule(run time.Duration) {
	var todo []pending
	next := w.now() + w.between(300*time.Millisecond, 2*time.Second)
	start := w.now()
	end := start + run
	for w.now() < end {
		slices.SortStableFunc(todo, byTime)
		for len(todo) > 0 && todo[0].at <= w.now() {
			todo[0].do()
			todo = todo[1:]
		}
		if w.now() < next {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		next = w.now() + w.between(300*time.Millisecond, 2*time.Second)
		kind := w.drawKind(w.now()-start > run/2)
		more, taken := w.step(kind)
		todo = append(todo, more...)
		if taken {
			w.mu.Lock()
			w.faults[kind]++
			w.mu.Unlock()
		}
	}
	slices.SortStableFunc(todo, byTime)
	for _, p := range todo {
		p.do()
	}
}

// drawKind draws the next step's kind; late, a kind of mustReach not yet
// taken comes first.
func (w *world) drawKind(late bool) string {
	p := w.rnd.Float64()
	if late {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, k := range mustReach {
			if w.faults[k] == 0 {
				return k
			}
		}
	}
	for _, k := range stepKinds {
		if p < k.chance {
			return k.name
		}
		p -= k.chance
	}
	return stepKinds[0].name
}

// step takes one step of the schedule: a rules reload; a kill of the Raft
// leader (restarted 0.5 to 3 s later); a cut-off agent across a reload
// (cutAndChange); a stall of one agent's links to every coordinator for
// 1.2 to 3 lease periods; the process agent paused whole (SIGSTOP) for as
// long (pause); a new agent; a Redis failover that loses a
// suffix of writes (redisFailover); a step of a Redis server's clock
// (stepClock); one agent's connections to the coordinators reset, or the
// coordinators' replies to it dropped for 0.1 to 0.6 s and its
// connections then reset (linkFaults); a region cut off the global group
// past its upstream lease (regionCut). It returns the steps that end it,
// and whether it was taken.
func (w *world) step(kind string) ([]pending, bool) {
	switch kind {
	case "reload":
		return nil, w.reload()
	case "leader kill":
		if w.down >= 0 {
			return nil, false
		}
		i, _ := w.coords.Leader(w.t)
		w.coords.Kill(i)
		w.down = i
		w.event("coordinator node%d (the leader) killed", i)
		return []pending{{at: w.now() + w.between(500*time.Millisecond, 3*time.Second), do: func() {
			w.coords.Restart(i)
			w.down = -1
			w.event("coordinator node%d restarted", i)
		}}}, true
	case "cut and change":
		more := w.cutAndChange()
		return more, more != nil
	case "stall":
		a := w.anyAgent()
		if a.stalled {
			return nil, false
		}
		for _, px := range a.proxies {
			px.Stall()
		}
		a.stalled = true
		w.event("agent %s's links to the coordinators stalled", a.name)
		return []pending{{at: w.now() + w.between(6*leasePeriod/5, 3*leasePeriod), do: func() {
			for _, px := range a.proxies {
				px.Resume()
			}
			a.stalled = false
			w.event("agent %s's links resumed", a.name)
		}}}, true
	case "pause":
		more := w.pause()
		return more, more != nil
	case "new agent":
		w.mu.Lock()
		n := len(w.agents) - 1 // the process agent is not counted
		w.mu.Unlock()
		if n >= maxAgents {
			return nil, false
		}
		w.startAgent(mainRegion)
		return nil, true
	case "redis failover":
		more := w.redisFailover()
		return more, more != nil
	case "redis clock step":
		w.stepClock()
		return nil, true
	case "region cut":
		more := w.regionCut()
		return more, more != nil
	default:
		return w.linkFaults(kind)
	}
}

func (w *world) anyAgent() *testAgent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.agents[w.rnd.IntN(len(w.agents))]
}

// linkFaults breaks one agent's calls to the coordinators mid-flight: its
// connections reset (the calls under way fail, its lease watch and renew
// streams break), or the replies to it dropped for 0.1 to 0.6 s and then
// its connections reset (the coordinators applied what they answered;
// the agent's client retries each call with the same sequence number on
// a new connection).
func (w *world) linkFaults(kind string) ([]pending, bool) {
	a := w.anyAgent()
	if a.stalled {
		return nil, false
	}
	if kind == "coordinator links reset" {
		for _, px := range a.proxies {
			px.Reset()
		}
		w.event("agent %s's connections to the coordinators reset", a.name)
		return nil, true
	}
	for _, px := range a.proxies {
		px.Blackhole(harness.Downstream)
	}
	a.stalled = true
	w.event("agent %s: the coordinators' replies dropped", a.name)
	return []pending{{at: w.now() + w.between(100*time.Millisecond, 600*time.Millisecond), do: func() {
		for _, px := range a.proxies {
			px.Heal()
			px.Reset()
		}
		a.stalled = false
		w.event("agent %s's connections to the coordinators reset, replies pass again", a.name)
	}}}, true
}

func byTime(a, b pending) int { return cmp.Compare(a.at, b.at) }

// regionCut cuts one region (either) off the global group for 1.2 to 3
// upstream lease terms: its links stalled (the regional leader's calls hang
// to their deadline, and the global group answers them late) or
// blackholed and reset (a silent partition). The cut region spends its
// slice until it expires, then its safe share, while the other region's
// leader leases what the global group reclaims of it; their agents spend
// the global rule's subjects throughout. It returns the step that ends
// it, or nil if that region is cut already.
func (w *world) regionCut() []pending {
	region := []string{mainRegion, remoteRegion}[w.rnd.IntN(2)]
	if w.cut[region] {
		return nil
	}
	links := w.hier.Links[region]
	stall := w.rnd.IntN(2) == 0
	for _, px := range links {
		if stall {
			px.Stall()
		} else {
			px.Blackhole()
			px.Reset()
		}
	}
	w.cut[region] = true
	how := map[bool]string{true: "stalled", false: "blackholed and reset"}[stall]
	w.event("region %s cut off the global group (its links %s)", region, how)
	return []pending{{at: w.now() + w.between(6*upstreamTerm/5, 3*upstreamTerm), do: func() {
		for _, px := range links {
			px.Heal()
		}
		w.cut[region] = false
		w.event("region %s's links to the global group healed", region)
	}}}
}

// cutAndChange composes the faults that matter together: an agent left
// without callers for a moment (its leases refill), then cut off from the
// coordinators, a rules reload while it is, and its callers back: it
// spends the leases it holds under the old rules while the others lease
// under the new ones. It returns the steps that end it.
func (w *world) cutAndChange() []pending {
	a := w.anyAgent()
	if a.stalled {
		return nil
	}
	a.quiet.Store(true)
	w.event("agent %s left without callers", a.name)
	stallAt := w.now() + w.between(300*time.Millisecond, time.Second)
	resumeAt := stallAt + w.between(6*leasePeriod/5, 3*leasePeriod)
	a.stalled = true
	return []pending{
		{at: stallAt, do: func() {
			for _, px := range a.proxies {
				px.Stall()
			}
			w.event("agent %s's links to the coordinators stalled", a.name)
			w.reload()
			a.quiet.Store(false)
			w.event("agent %s has callers again", a.name)
		}},
		{at: resumeAt, do: func() {
			for _, px := range a.proxies {
				px.Resume()
			}
			a.stalled = false
			w.event("agent %s's links resumed", a.name)
		}},
	}
}

func (w *world) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(w.rnd.Int64N(int64(hi-lo)+1))
}

// reload changes one rule's shape: its burst or rate (grown or shrunk),
// default_share of the rule that has one, or the mode of the rule that
// switches between redis and auto. The agents read the new file within
// their reload interval; the coordinators (every group's) get it at once.
// The global rule is left as it is: the judge knows no linger for a shape
// change leased down two levels.
func (w *world) reload() bool {
	names := slices.DeleteFunc(ruleNames(), func(n string) bool { return initialShapes[n].Global })
	name := names[w.rnd.IntN(len(names))]
	w.mu.Lock()
	old := w.shapes[name]
	w.mu.Unlock()
	s := old
	bursts, rates := []float64{10, 20, 40}, []float64{5, 10, 20, 40}
	switch k := w.rnd.IntN(3); {
	case name == "flip" && k == 0:
		s.Mode = map[string]string{"redis": "auto", "auto": "redis"}[s.Mode]
	case name == "share" && k < 2:
		shares := []float64{0, 0.3, 0.5, 0.8}
		s.DefaultShare = shares[w.rnd.IntN(len(shares))]
	case k == 1:
		s.Burst = bursts[w.rnd.IntN(len(bursts))]
	default:
		s.Rate = rates[w.rnd.IntN(len(rates))]
	}
	if s == old {
		return false
	}
	w.mu.Lock()
	w.shapes[name] = s
	yaml := rulesYAML(w.shapes)
	w.mu.Unlock()
	set, err := rules.Parse("rules.yaml", []byte(yaml))
	if err != nil {
		w.t.Fatalf("reload of %s to %v: %v\n%s", name, s, err, yaml)
	}
	// Written whole and renamed into place, as a ConfigMap swap: an agent
	// never reads half a file.
	tmp := w.rulesPath + ".new"
	if err := os.WriteFile(tmp, []byte(yaml), 0o644); err != nil {
		w.t.Fatal(err)
	}
	at := w.now()
	if err := os.Rename(tmp, w.rulesPath); err != nil {
		w.t.Fatal(err)
	}
	for _, g := range append([]*harness.Coordinators{w.hier.Global}, w.regionGroups()...) {
		g.SetRules(set)
	}
	w.mu.Lock()
	tl := w.timelines[name]
	tl.changes = append(tl.changes, change{At: at, Rule: name, From: old, To: s})
	w.mu.Unlock()
	w.event("reload: %s from %v to %v", name, old, s)
	return true
}
