package bound

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/harness"
)

// The checker's knobs, for a run by hand:
//
//	RATION_BOUND_SEED=7 RATION_BOUND_RUN=10m go test -race -run TestBoundOnEveryPath -timeout 20m ./test/bound/
const (
	envSeed = "RATION_BOUND_SEED" // the schedule's seed (default 3)
	envRun  = "RATION_BOUND_RUN"  // how long the load and the faults run (default 40s)

	defaultSeed = 3
	defaultRun  = 40 * time.Second
)

// The world's timings. A lease lasts a second, so a stall of the link to
// the coordinators outlives it; a decision waits up to a second for a new
// subject's first grant (so a batch's later items are decided a second
// after it started); agents read the rules file every 50ms.
const (
	leasePeriod     = time.Second
	decisionTimeout = time.Second
	reloadInterval  = 50 * time.Millisecond
	safetyMargin    = 200 * time.Millisecond // harness.RaftTestConfig's
	autoHold        = 300 * time.Millisecond // the auto rules' auto.hold
	idleAfter       = 3 * time.Second        // the lease holder's, 1m in a process
	maxAgents       = 4                      // in-process; the process agent besides
	workers         = 8
	// The global rule's lease period, which its upstream leases (a
	// regional group's, from the global group) last: a region cut
	// outlives it. Two seconds, so that a cut region that went on
	// spending its slice past it would do so for long enough to show.
	upstreamTerm = 2 * leasePeriod
	// Each region's safe share of the global rule (its rate; the burst in
	// proportion): what a region cut off past its slice still admits.
	// They sum to at most the rule's rate, for which docs/configuration.md
	// (regions.R.safe_share) states B + r*T for cuts of any length.
	safeShare = 1
)

// The regions: the agents of the first (the 3-node group's) use every
// rule; the second, one coordinator node and one agent, only the global
// rule, so that its subjects are spent in both regions at once.
const (
	mainRegion   = "eu"
	remoteRegion = "us"
	globalRule   = "global"
)

// The rules, one per way of deciding, each with fail_closed so that no
// failure policy admits: a store or coordinator out of reach refuses.
var initialShapes = map[string]shape{
	"redis":  {Mode: "redis", Burst: 20, Rate: 10},
	"leased": {Mode: "leased", Burst: 40, Rate: 20},
	"share":  {Mode: "leased", Burst: 40, Rate: 40, DefaultShare: 0.5},
	"auto":   {Mode: "auto", Burst: 20, Rate: 20},
	"flip":   {Mode: "redis", Burst: 20, Rate: 20}, // reloads switch it between redis and auto
	// scope: global, leased down the hierarchy: the global group leases
	// each region's group a slice, which leases its agents. Not reloaded.
	// Small, so that its hot subject's demand in either region alone
	// exceeds it (the callers' rate under -race is modest).
	globalRule: {Mode: "leased", Burst: 10, Rate: 10, Global: true},
}

func ruleNames() []string {
	names := make([]string, 0, len(initialShapes))
	for n := range initialShapes {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// rulesYAML renders shapes as a rules file, in name order. Each rule
// matches {m: <its name>, user: "*"}, so a request names one rule and
// one subject.
func rulesYAML(shapes map[string]shape) string {
	var b strings.Builder
	b.WriteString("rules:\n")
	for _, name := range ruleNames() {
		s := shapes[name]
		fmt.Fprintf(&b, "  - name: %s\n    match: {m: %s, user: \"*\"}\n    burst: %g\n    rate: %g\n    on_failure: fail_closed\n", name, name, s.Burst, s.Rate)
		if s.Mode != "redis" {
			fmt.Fprintf(&b, "    mode: %s\n", s.Mode)
		}
		switch {
		case s.Mode == "leased" && s.DefaultShare > 0:
			fmt.Fprintf(&b, "    lease: {period: %v, default_share: %g}\n", leasePeriod, s.DefaultShare)
		case s.Global:
			fmt.Fprintf(&b, "    lease: {period: %v}\n", upstreamTerm)
		case s.Mode != "redis":
			fmt.Fprintf(&b, "    lease: {period: %v}\n", leasePeriod)
		}
		if s.Global {
			fmt.Fprintf(&b, "    scope: global\n    regions: {%s: {safe_share: %d}, %s: {safe_share: %d}}\n",
				mainRegion, safeShare, remoteRegion, safeShare)
		}
		if s.Mode == "auto" {
			fmt.Fprintf(&b, "    auto: {promote_above: 10, hold: %v}\n", autoHold)
		}
	}
	return b.String()
}

func seedAndRun(t *testing.T) (uint64, time.Duration) {
	t.Helper()
	seed, run := uint64(defaultSeed), defaultRun
	if v := os.Getenv(envSeed); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want a whole number: %v", envSeed, v, err)
		}
		seed = n
	}
	if v := os.Getenv(envRun); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration such as 10m", envRun, v)
		}
		run = d
	}
	return seed, run
}

// TestBoundOnEveryPath is the bound checker: a 3-node coordinator group
// (region eu's, leasing the global rule from a 1-node global group), a
// second region (one node, one agent) spending the global rule's subjects
// too, a redis-server, agents in-process and one agent process (region
// eu's, which the schedule pauses: process_test.go), every agent's link to
// the coordinators and every region's to the global group through a
// harness.Proxy. Workers call the agents through each decision entry
// point (entry_test.go) with a few hot subjects and a stream of new ones,
// while the test's goroutine follows a seeded schedule of faults and
// reloads (schedule_test.go). Every admission the callers saw, in either
// region, is held to B + r*T per (rule, subject) in every window (judge).
func TestBoundOnEveryPath(t *testing.T) {
	if testing.Short() {
		t.Skip("the bound checker runs real processes for a while")
	}
	seed, run := seedAndRun(t)
	t.Logf("bound checker: seed %d, run %v (%s, %s)", seed, run, envSeed, envRun)
	w := newWorld(t, seed)
	for range 2 {
		w.startAgent(mainRegion)
	}
	w.proc = w.startProcessAgent()
	w.remote = w.startAgent(remoteRegion)
	w.startLoad(seed)
	w.runSchedule(run)
	w.stopLoad()
	w.verify(seed)
	w.checkProcessRaces()
}

// world is the system under test and what the checker saw of it.
type world struct {
	t         *testing.T
	rnd       *rand.Rand // the schedule's; the test's goroutine only
	origin    time.Time
	rulesPath string
	// The hierarchy: the global group (one node, never killed), region
	// eu's 3-node group (coords: the one the schedule kills leaders of)
	// and region us's single node, each region's links to the global
	// group through proxies (hier.Links).
	hier   *harness.Hierarchy
	coords *harness.Coordinators
	remote *testAgent      // region us's agent; not in agents
	cut    map[string]bool // regions cut off the global group; the schedule's

	// The store: the primary the agents reach through redisPx, and its
	// replica (store_test.go). The schedule's; the test's goroutine only.
	primary, replica *redisNode
	redisPx          *harness.Proxy
	failingOver      bool
	down             int // the coordinator node killed, -1 if none

	mu          sync.Mutex
	shapes      map[string]shape
	timelines   map[string]*timeline
	events      []string
	agents      []*testAgent                // region eu's, the process agent among them
	proc        *testAgent                  // the agent run as a process (process_test.go)
	spans       map[string][]admission.Span // by rule|subject
	refused     map[string][]admission.Span // by rule|subject: refusals, for the second judge
	eventAt     []time.Duration             // when each schedule event was logged
	byEntry     map[string]int              // admissions by entry point
	globalBy    map[string]float64          // the global rule's admitted tokens by region
	calls       map[string]int              // calls by entry point
	fresh       atomic.Int64                // new subjects handed out
	failovers   []failover                  // Redis failovers, in time order
	steps       []clockStep                 // forward steps of the agents' store's clock
	faults      map[string]int              // the schedule's steps by kind
	retries     atomic.Int64                // coordinator calls the agents' clients retried
	streamEnds  atomic.Int64                // lease watch streams that ended
	pausedCalls atomic.Int64                // calls that waited on the paused process agent

	rush atomic.Pointer[rush] // callers sent to an agent just resumed (process_test.go)

	stop chan struct{}
	wg   sync.WaitGroup
}

func newWorld(t *testing.T, seed uint64) *world {
	t.Helper()
	w := &world{
		t:         t,
		rnd:       rand.New(rand.NewPCG(seed, 0x626f756e64)),
		shapes:    map[string]shape{},
		timelines: map[string]*timeline{},
		spans:     map[string][]admission.Span{},
		refused:   map[string][]admission.Span{},
		byEntry:   map[string]int{},
		globalBy:  map[string]float64{},
		calls:     map[string]int{},
		faults:    map[string]int{},
		cut:       map[string]bool{},
		down:      -1,
		stop:      make(chan struct{}),
	}
	for name, s := range initialShapes {
		w.shapes[name] = s
		w.timelines[name] = &timeline{
			initial: s,
			linger:  2*reloadInterval + leasePeriod + safetyMargin + 100*time.Millisecond,
			lag:     2*reloadInterval + 50*time.Millisecond,
			hold:    autoHold,
		}
	}
	yaml := rulesYAML(w.shapes)
	w.hier = harness.StartHierarchy(t, 1, yaml, nil)
	w.coords = w.hier.AddRegion(mainRegion, 3)
	w.hier.AddRegion(remoteRegion, 1)
	w.startStore()
	w.rulesPath = filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(w.rulesPath, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	w.origin = time.Now()
	return w
}

func (w *world) now() time.Duration { return time.Since(w.origin) }

// regionGroups are the regions' coordinator groups, the main region's first.
func (w *world) regionGroups() []*harness.Coordinators {
	return []*harness.Coordinators{w.hier.Regions[mainRegion], w.hier.Regions[remoteRegion]}
}

// event logs one step of the schedule, with its time on the judge's clock.
func (w *world) event(format string, args ...any) {
	e := fmt.Sprintf("%9.3fs  ", w.now().Seconds()) + fmt.Sprintf(format, args...)
	w.mu.Lock()
	w.events = append(w.events, e)
	w.eventAt = append(w.eventAt, w.now())
	w.mu.Unlock()
	if testing.Verbose() {
		w.t.Log(e)
	}
}

// admit records one admission the caller saw, sent at from and answered
// at to.
func (w *world) admit(a *testAgent, entry, rule, user string, cost float64, from, to time.Duration) {
	w.mu.Lock()
	w.spans[rule+"|"+user] = append(w.spans[rule+"|"+user], admission.Span{From: from, To: to, Cost: cost})
	w.byEntry[entry]++
	if rule == globalRule {
		w.globalBy[a.region] += cost
	}
	w.mu.Unlock()
}

// decided records one decision the caller saw: an admission, or a
// refusal (over the limit, or by a failure policy) for the second judge.
func (w *world) decided(a *testAgent, entry string, it item, allowed bool, from, to time.Duration) {
	if allowed {
		w.admit(a, entry, it.rule, it.user, it.cost, from, to)
		return
	}
	w.refuse(it, from, to)
}

// refuse records one refusal the caller saw, sent at from and answered
// at to.
func (w *world) refuse(it item, from, to time.Duration) {
	w.mu.Lock()
	k := it.rule + "|" + it.user
	w.refused[k] = append(w.refused[k], admission.Span{From: from, To: to, Cost: it.cost})
	w.mu.Unlock()
}

func (w *world) called(entry string) {
	w.mu.Lock()
	w.calls[entry]++
	w.mu.Unlock()
}

// verify judges every (rule, subject) and says what the run exercised.
func (w *world) verify(seed uint64) {
	t := w.t
	w.mu.Lock()
	defer w.mu.Unlock()
	keys := make([]string, 0, len(w.spans))
	for k := range w.spans {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var bad []string
	var admitted int
	// How near each rule came to its bound: how much a bug must add to be
	// seen (a window where the subject spent its whole burst and then
	// its rate is at 0).
	closest, closestSubject := map[string]verdict{}, map[string]string{}
	// The same without the store's allowances: how much the failovers and
	// clock steps did overshoot the plain bound (> 0: the faults reached
	// the bound, and their allowance was needed).
	bare := map[string]float64{}
	for _, k := range keys {
		rule, subject, _ := strings.Cut(k, "|")
		spans := w.spans[k]
		admitted += len(spans)
		tl := *w.timelines[rule]
		tl.failovers, tl.steps = w.failovers, w.steps
		v := judge(tl, spans)
		tl.failovers, tl.steps = nil, nil
		o := judge(tl, spans).Over
		if b, ok := bare[rule]; !ok || o > b {
			bare[rule] = o
		}
		if c, ok := closest[rule]; !ok || v.Over > c.Over {
			closest[rule] = v
			closestSubject[rule] = subject
		}
		if v.Over > 1e-6 {
			bad = append(bad, fmt.Sprintf("rule %s subject user=%s: %.2f tokens over the bound in [%.3fs, %.3fs] "+
				"(B %g, r %g, %d mode switches and %d store faults allowed for, %.2f tokens; %d admissions, %.0f tokens, in the judged stretch)",
				rule, subject, v.Over, v.From.Seconds(), v.To.Seconds(), v.Burst, v.Rate, v.Switches, v.Store, v.Extra, v.Count, v.Admitted))
		}
	}
	var entries []string
	for _, e := range entryNames {
		entries = append(entries, fmt.Sprintf("%s %d/%d", e, w.byEntry[e], w.calls[e]))
	}
	promotions, leased := w.metrics()
	t.Logf("bound checker: %d subjects, %d admissions; admitted/calls by entry point: %s; %v hot promotions taken up, %v decisions on leases",
		len(keys), admitted, strings.Join(entries, ", "), promotions, leased)
	if w.proc != nil {
		// Leases the process agent held through a pause lapse at the
		// coordinators: its first renewals after it are answered
		// expired (and stalls, resets and leader kills add theirs).
		t.Logf("bound checker: the process agent's leases reported expired by the coordinators: %v (ration_agent_lease_expired_total)",
			w.procMetric(w.proc, "ration_agent_lease_expired_total", ""))
	}
	w.logRegions()
	var kinds []string
	for _, k := range stepKinds {
		kinds = append(kinds, fmt.Sprintf("%s %d", k.name, w.faults[k.name]))
	}
	var lost []string
	lostSome := false
	for _, f := range w.failovers {
		lost = append(lost, fmt.Sprintf("%v (%d bytes)", (f.Promoted-f.Cut).Round(time.Millisecond), f.Lost))
		lostSome = lostSome || f.Lost > 0
	}
	var ahead []string
	for _, s := range w.steps {
		ahead = append(ahead, s.D.Round(time.Millisecond).String())
	}
	t.Logf("bound checker: schedule steps taken: %s; failovers' lost writes: %s; forward clock steps: %s; coordinator calls retried %d, lease watch streams ended %d (in-process agents'); calls that waited on the paused process agent %d",
		strings.Join(kinds, ", "), strings.Join(lost, ", "), strings.Join(ahead, ", "), w.retries.Load(), w.streamEnds.Load(), w.pausedCalls.Load())
	w.logRefusals()
	for _, rule := range ruleNames() {
		c := closest[rule]
		t.Logf("rule %s: closest to its bound: user=%s %.2f tokens in [%.3fs, %.3fs] (B %g, r %g, %.2f allowed for %d store faults); without the store's allowances: %.2f",
			rule, closestSubject[rule], c.Over, c.From.Seconds(), c.To.Seconds(), c.Burst, c.Rate, c.Extra, c.Store, bare[rule])
	}
	if len(bad) > 0 {
		t.Errorf("bound checker, seed %d (%s=%d to run it again): the bound broke:\n  %s\nschedule (seconds on the judge's clock; spans are [send, answer]):\n  %s",
			seed, envSeed, seed, strings.Join(bad, "\n  "), strings.Join(w.events, "\n  "))
	}
	// The verdict means nothing if the run did not reach the paths.
	for _, e := range entryNames {
		if w.byEntry[e] == 0 {
			t.Errorf("no admission through %s: the run did not exercise it", e)
		}
	}
	if promotions == 0 || leased == 0 {
		t.Errorf("%v hot promotions, %v decisions on leases: the run did not exercise the leased paths", promotions, leased)
	}
	for _, k := range mustReach {
		if w.faults[k] == 0 {
			t.Errorf("the schedule took no %q step: the run did not exercise it", k)
		}
	}
	if !lostSome {
		t.Errorf("no Redis failover lost a write (replication bytes lost: %s): the run did not exercise it", strings.Join(lost, ", "))
	}
	if w.faults["pause"] > 0 && w.pausedCalls.Load() == 0 {
		t.Errorf("no call waited on the paused agent: the run did not exercise a pause under load")
	}
	for _, r := range []string{mainRegion, remoteRegion} {
		if w.globalBy[r] == 0 {
			t.Errorf("region %s admitted nothing of the global rule: the run did not spend it in both regions", r)
		}
	}
	if w.retries.Load() == 0 {
		t.Errorf("the agents' coordinator clients retried no call: the run did not exercise it")
	}
}

// refusalSettle is how long after a schedule event the second judge
// counts a false refusal as the event's: three lease periods (a stalled
// or paused agent's leases lapse and are granted anew, a killed leader's
// successor answers, a reloaded shape reaches every lease).
const refusalSettle = 3 * leasePeriod

// logRefusals runs the second judge on every (rule, subject) of keys and
// logs, per rule, its refusals, the false ones (a 429 or a failure
// policy's denial of a request an exact bucket fed the admitted history
// would have admitted) and those of them in a steady stretch, and how
// much of its budget the hot subject got. The schedule steps every 0.3 to
// 2 s, so nearly every stretch is near a fault: the checker holds no
// allowance for false refusals (docs/reliability.md, The other half); it
// prints them, as the chaos rows do. A subject asked far beyond its rate
// counts each of its refusals false while the exact bucket holds a token,
// so the counts follow how hard it is asked; the tokens and the hot
// subject's utilisation say how much was lost. The caller holds w.mu.
func (w *world) logRefusals() {
	type sum struct {
		refused, falses, steady int
		cost                    float64
	}
	by := map[string]*sum{}
	keys := slices.Sorted(maps.Keys(w.refused))
	for _, k := range keys {
		rule, _, _ := strings.Cut(k, "|")
		v := judgeRefusals(*w.timelines[rule], w.spans[k], w.refused[k], w.eventAt, refusalSettle)
		if by[rule] == nil {
			by[rule] = &sum{}
		}
		by[rule].refused += v.Refused
		by[rule].falses += v.False
		by[rule].steady += v.Steady
		by[rule].cost += v.FalseCost
	}
	for _, rule := range ruleNames() {
		s := by[rule]
		if s == nil {
			s = &sum{}
		}
		// The hot subject is asked far beyond its rate: what it was
		// admitted, against the largest shape the rule had (so a lower
		// bound of its utilisation), is how much of the budget the
		// faults and the leases' movements left unspent.
		var hot float64
		for _, sp := range w.spans[rule+"|hot"] {
			hot += sp.Cost
		}
		tl := w.timelines[rule]
		burst, rate := tl.initial.Burst, tl.initial.Rate
		for _, c := range tl.changes {
			burst, rate = max(burst, c.To.Burst), max(rate, c.To.Rate)
		}
		w.t.Logf("rule %s: refusals %d, false %d (%.0f tokens; a request an exact bucket fed the admissions would have admitted), %d of them with no schedule event in the %v before; subject hot admitted %.0f, %.2f of B + r*T at the largest shape (B %g, r %g)",
			rule, s.refused, s.falses, s.cost, s.steady, refusalSettle, hot, hot/(burst+rate*w.now().Seconds()), burst, rate)
	}
}

// logRegions says what the run did with the global rule: how near its hot
// subject came to its rate, what each region admitted of it, and how many
// upstream renewals failed. The caller holds w.mu.
func (w *world) logRegions() {
	upFailed := w.upstreamFailures()
	// How near the global rule's hot subject, wanted beyond its rate in
	// both regions, came to its rate over the run: what a cut region's
	// extra spending must exceed to be seen is about the rest.
	var hotGlobal float64
	for _, sp := range w.spans[globalRule+"|hot"] {
		hotGlobal += sp.Cost
	}
	w.t.Logf("bound checker: the global rule's subject hot admitted %.1f tokens/s over the run (r %g)",
		hotGlobal/w.now().Seconds(), initialShapes[globalRule].Rate)
	w.t.Logf("bound checker: the global rule's tokens admitted in region %s %.0f, in %s %.0f; upstream renewals failed %v (the live regional nodes' count: a stall shorter than a call's 2s deadline delays the renewal past the upstream lease, and fails none)",
		mainRegion, w.globalBy[mainRegion], remoteRegion, w.globalBy[remoteRegion], upFailed)
}
