package bound

import (
	"bufio"
	"strconv"
	"strings"

	"github.com/ration-dev/ration/internal/harness"
)

// startProcessAgent starts the one agent that runs as a gateway-agent
// process, built from this tree (harness.BuildCommand), so that the
// schedule can pause it whole (pause): an in-process agent cannot be
// frozen, and a stall of its links leaves its own code running (its
// clock checks, its lease loop, its timers). It is configured as the
// in-process agents are, through its flags, on the same rules file, its
// own proxy to each coordinator and the agents' Redis proxy; but for its
// lease holder's idle release, which has no flag: a quota idle for a
// minute, not 3 s, is released (so its default-share copies are not
// forgotten within a run; the in-process agents' are).
//
// The build (a link step, seconds on a loaded machine) and the start run
// on a goroutine while the rest of the world starts and the load begins;
// joinProcess hands the agent to the callers once it is ready.
func (w *world) startProcessAgent() {
	t := w.t
	t.Helper()
	a := &testAgent{name: "p1"}
	addrs := w.linkAgent(a)
	args := []string{"-rules", w.rulesPath, "-redis", w.redisPx.Addr(), "-coordinators", strings.Join(addrs, ","), "-insecure",
		"-decision-timeout", decisionTimeout.String(), "-first-grant-timeout", decisionTimeout.String(),
		"-reload-interval", reloadInterval.String(), "-log-level", "info"}
	dir := t.TempDir()
	done := make(chan error, 1)
	w.procStarted = done
	go func() {
		bin, err := harness.BuildCommand(t.Context(), dir, "gateway-agent")
		if err == nil {
			a.proc, err = harness.StartAgentProcess(t, bin, a.name, args...)
		}
		if err == nil {
			w.proc = a
		}
		done <- err
	}()
}

// joinProcess hands the process agent to the callers once it has started
// (at once if wait), and fails the test if it could not start.
func (w *world) joinProcess(wait bool) {
	if w.procStarted == nil {
		return
	}
	var err error
	if wait {
		err = <-w.procStarted
	} else {
		select {
		case err = <-w.procStarted:
		default:
			return
		}
	}
	w.procStarted = nil
	if err != nil {
		w.t.Fatalf("the process agent: %v", err)
	}
	a := w.proc
	w.join(a, a.proc.GRPC, a.proc.HTTP)
	w.event("agent %s started (a process)", a.name)
}

// pause freezes the process agent (SIGSTOP) for 1.2 to 3 lease periods,
// with the callers still calling it: its decisions under way stop between
// whatever clock reading and spend they were at, its leases lapse at the
// coordinators while its lease loop is frozen, and at SIGCONT its timers
// fire late, all at once, with the calls that waited meanwhile. It
// returns the step that ends it, or nil if it is under a fault already.
func (w *world) pause() []pending {
	a := w.proc
	if w.procStarted != nil || a == nil || a.stalled {
		return nil
	}
	a.stalled = true
	a.proc.Pause()
	w.event("agent %s paused (SIGSTOP), %d calls in flight to it", a.name, a.inflight.Load())
	return []pending{{at: w.now() + w.between(6*leasePeriod/5, 3*leasePeriod), do: func() {
		waiting := a.inflight.Load()
		a.proc.Resume()
		a.stalled = false
		w.pausedCalls.Add(waiting)
		w.event("agent %s resumed (SIGCONT), %d calls waiting on it", a.name, waiting)
	}}}
}

// procMetrics reads, from the process agent's /metrics, what metrics
// gathers from an in-process agent's registry.
func (w *world) procMetrics(a *testAgent) (promotions, leased float64) {
	text, err := a.proc.Metrics()
	if err != nil {
		w.t.Fatalf("%v", err)
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		name, rest, _ := strings.Cut(line, " ")
		labels := ""
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			name, labels, rest = line[:i], line[i:j+1], strings.TrimSpace(line[j+1:])
		}
		v, err := strconv.ParseFloat(strings.Fields(rest + " x")[0], 64)
		if err != nil {
			continue
		}
		switch {
		case name == "ration_agent_hot_promotions_total":
			promotions += v
		case name == "ration_decisions_total" && strings.Contains(labels, `path="leased"`):
			leased += v
		}
	}
	return promotions, leased
}
