package bound

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/logformat"

	"github.com/ration-dev/ration/internal/harness"
)

// envAgentProcess, set in a child's environment, makes the test binary
// run as a gateway-agent process (TestMain) instead of running tests.
const envAgentProcess = "RATION_BOUND_AGENT_PROCESS"

func TestMain(m *testing.M) {
	if os.Getenv(envAgentProcess) != "" {
		os.Exit(runAgentProcess(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// runAgentProcess is the agent process: cmd/gateway-agent's run, from
// its flags (agent.Config.BindFlags) to agent.Start with the holder the
// agent builds itself, and SIGTERM to shut down; without -dev, -validate,
// -version and SIGHUP, which the checker does not use. The test binary
// re-executes itself as it rather than building cmd/gateway-agent: on a
// loaded machine that build (a link step) took 10 to 20 s, a third of
// the run without the process. Being the test binary, it is built with
// -race when the test is.
func runAgentProcess(args []string) int {
	cfg := agent.DefaultConfig()
	fs := flag.NewFlagSet("gateway-agent", flag.ContinueOnError)
	cfg.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := cfg.Check(); err != nil {
		fmt.Fprintln(os.Stderr, "gateway-agent:", err)
		return 2
	}
	format, _ := logformat.Parse(cfg.LogFormat)
	level := slog.LevelInfo
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	logger := logformat.New(os.Stderr, format, level)
	redis.SetLogger(agent.RedisLogger{Logger: logger})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv, err := agent.Start(ctx, cfg, logger, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway-agent:", err)
		return 2
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		fmt.Fprintln(os.Stderr, "gateway-agent:", err)
		return 2
	}
	return 0
}

// startProcessAgent starts the one agent that runs as a process of its
// own (runAgentProcess), so that the schedule can pause it whole (pause):
// an in-process agent cannot be frozen, and a stall of its links leaves
// its own code running (its clock checks, its lease loop, its timers).
// It is configured as region eu's in-process agents are, through its
// flags: every rule, the same rules file, its own proxy to each
// coordinator of region eu's group and the agents' Redis proxy; but for its lease holder, which is the one the agent
// builds: a quota idle for a minute, not 3 s, is released (its
// default-share copies are not forgotten within a run; the in-process
// agents' are), and its coordinator client's retries are not counted.
func (w *world) startProcessAgent() *testAgent {
	t := w.t
	t.Helper()
	a := &testAgent{name: "p1", region: mainRegion, rules: ruleNames()}
	addrs := w.linkAgent(a)
	var err error
	a.proc, err = harness.StartAgentProcess(t, harness.AgentProcessOptions{
		Bin: os.Args[0], ID: a.name, Env: []string{envAgentProcess + "=1"},
		Args: []string{"-rules", w.rulesPath, "-redis", w.redisPx.Addr(), "-coordinators", strings.Join(addrs, ","), "-region", a.region, "-insecure",
			"-decision-timeout", decisionTimeout.String(), "-first-grant-timeout", decisionTimeout.String(),
			"-reload-interval", reloadInterval.String(), "-log-level", "info"},
	})
	if err != nil {
		t.Fatalf("the process agent: %v", err)
	}
	w.join(a, a.proc.GRPC, a.proc.HTTP)
	w.event("agent %s of region %s started (a process)", a.name, a.region)
	return a
}

// pause freezes the process agent (SIGSTOP) for 1.2 to 3 lease periods,
// with the callers still calling it: its decisions under way stop between
// whatever clock reading and spend they were at, its leases lapse at the
// coordinators while its lease loop is frozen, and at SIGCONT its timers
// fire late, all at once, with the calls that waited meanwhile; then
// every caller calls it for rushFor. It returns the step that ends it, or
// nil if it is under a fault already.
func (w *world) pause() []pending {
	a := w.proc
	if a == nil || a.stalled {
		return nil
	}
	a.stalled = true
	a.proc.Pause()
	w.event("agent %s paused (SIGSTOP), %d calls in flight to it", a.name, a.inflight.Load())
	return []pending{{at: w.now() + w.between(6*leasePeriod/5, 3*leasePeriod), do: func() {
		waiting := a.inflight.Load()
		a.proc.Resume()
		w.rush.Store(&rush{to: a, until: time.Now().Add(rushFor)})
		a.stalled = false
		w.pausedCalls.Add(waiting)
		w.event("agent %s resumed (SIGCONT), %d calls waiting on it", a.name, waiting)
	}}}
}

// rushFor is how long every caller calls an agent just resumed: its first
// decisions after a pause are the ones a caller could see wrong (the
// calls that waited through it span it whole).
const rushFor = 300 * time.Millisecond

// rush sends every caller to one agent until a time.
type rush struct {
	to    *testAgent
	until time.Time
}

// rushing reports the agent every caller should call now, if any.
func (w *world) rushing() (*testAgent, bool) {
	r := w.rush.Load()
	if r == nil || time.Now().After(r.until) {
		return nil, false
	}
	return r.to, true
}

// procMetrics reads, from the process agent's /metrics, what metrics
// gathers from an in-process agent's registry.
func (w *world) procMetrics(a *testAgent) (promotions, leased float64) {
	return w.procMetric(a, "ration_agent_hot_promotions_total", ""), w.procMetric(a, "ration_decisions_total", `path="leased"`)
}

// procMetric sums the process agent's samples of the metric name whose
// labels hold label ("" for all).
func (w *world) procMetric(a *testAgent, name, label string) float64 {
	text, err := a.proc.Metrics()
	if err != nil {
		w.t.Fatalf("%v", err)
	}
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		n, rest, _ := strings.Cut(line, " ")
		labels := ""
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			n, labels, rest = line[:i], line[i:j+1], strings.TrimSpace(line[j+1:])
		}
		if n != name || !strings.Contains(labels, label) {
			continue
		}
		if v, err := strconv.ParseFloat(strings.Fields(rest + " x")[0], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// checkProcessRaces fails the test if the race detector reported a race
// in the agent process (built with -race when the test is): its reports
// go to the process's output, and the process is killed at the end, so
// they would fail nothing.
func (w *world) checkProcessRaces() {
	if w.proc == nil {
		return
	}
	if out := w.proc.proc.Tail(1 << 30); strings.Contains(out, "WARNING: DATA RACE") {
		i := strings.Index(out, "WARNING: DATA RACE")
		w.t.Errorf("the agent process reported a data race:\n%s", out[i:min(len(out), i+8000)])
	}
}
