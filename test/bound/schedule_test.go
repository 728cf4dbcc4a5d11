package bound

import (
	"cmp"
	"os"
	"slices"
	"time"

	"github.com/ration-dev/ration/internal/rules"
)

// pending is a step the schedule has committed to: the end of a fault.
type pending struct {
	at time.Duration
	do func()
}

// runSchedule follows the seeded schedule for run, on the test's
// goroutine (the harness's Kill and Restart must be called there): every
// 0.3 to 2 s one of a rules reload, a kill of the Raft leader (restarted
// 0.5 to 3 s later), a cut-off agent across a reload (cutAndChange), a
// stall of one agent's links to every coordinator for 1.2 to 3 lease
// periods, or a new agent. At the end the steps still pending are taken
// in their order, so that every fault is undone.
func (w *world) runSchedule(run time.Duration) {
	var todo []pending
	down := -1 // the node killed, if any
	next := w.now() + w.between(300*time.Millisecond, 2*time.Second)
	end := w.now() + run
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
		switch p := w.rnd.Float64(); {
		case p < 0.35:
			w.reload()
		case p < 0.45:
			if down >= 0 {
				continue
			}
			i, _ := w.coords.Leader(w.t)
			w.coords.Kill(i)
			down = i
			w.event("coordinator node%d (the leader) killed", i)
			todo = append(todo, pending{at: w.now() + w.between(500*time.Millisecond, 3*time.Second), do: func() {
				w.coords.Restart(i)
				down = -1
				w.event("coordinator node%d restarted", i)
			}})
		case p < 0.6:
			todo = append(todo, w.cutAndChange()...)
		case p < 0.9:
			w.mu.Lock()
			a := w.agents[w.rnd.IntN(len(w.agents))]
			w.mu.Unlock()
			if a.stalled {
				continue
			}
			for _, px := range a.proxies {
				px.Stall()
			}
			a.stalled = true
			w.event("agent %s's links to the coordinators stalled", a.name)
			todo = append(todo, pending{at: w.now() + w.between(6*leasePeriod/5, 3*leasePeriod), do: func() {
				for _, px := range a.proxies {
					px.Resume()
				}
				a.stalled = false
				w.event("agent %s's links resumed", a.name)
			}})
		default:
			w.mu.Lock()
			n := len(w.agents)
			w.mu.Unlock()
			if n < maxAgents {
				w.startAgent()
			}
		}
	}
	slices.SortStableFunc(todo, byTime)
	for _, p := range todo {
		p.do()
	}
}

func byTime(a, b pending) int { return cmp.Compare(a.at, b.at) }

// cutAndChange composes the faults that matter together: an agent left
// without callers for a moment (its leases refill), then cut off from the
// coordinators, a rules reload while it is, and its callers back: it
// spends the leases it holds under the old rules while the others lease
// under the new ones. It returns the steps that end it.
func (w *world) cutAndChange() []pending {
	w.mu.Lock()
	a := w.agents[w.rnd.IntN(len(w.agents))]
	w.mu.Unlock()
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
// their reload interval; the coordinators get it at once.
func (w *world) reload() {
	names := ruleNames()
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
		return
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
	w.coords.SetRules(set)
	w.mu.Lock()
	tl := w.timelines[name]
	tl.changes = append(tl.changes, change{At: at, Rule: name, From: old, To: s})
	w.mu.Unlock()
	w.event("reload: %s from %v to %v", name, old, s)
}
