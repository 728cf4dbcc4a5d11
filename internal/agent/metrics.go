package agent

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/rules"
)

// metrics are the agent's Prometheus series. Labels are bounded: rule names
// come from the rules file (at most rules.MaxRules), never subjects.
type metrics struct {
	decisions     *prometheus.CounterVec // rule, path, result, reason
	decisionCache sync.Map               // decisionKey -> prometheus.Counter
	// byRule holds each rule's decision counters, resolved once per rule
	// and combination (ruleCounters): a decision finds its counter by the
	// rule's pointer and three small indexes, with no label hashing and no
	// lookup by name. Rebuilt by forgetRules for each set of rules.
	byRule atomic.Pointer[map[*rules.Rule]*ruleCounters]
	// durationOf caches duration's observer of each path.
	durationOf           [len(pathNames)]atomic.Pointer[observerRef]
	noRule               prometheus.Counter
	invalid              prometheus.Counter
	duration             *prometheus.HistogramVec // path
	storeErrors          *prometheus.CounterVec   // kind
	breakerShortCircuits prometheus.Counter
	breakerOpen          prometheus.Gauge
	breakerNodeOpen      *prometheus.GaugeVec // node
	fallbackNodeActive   *prometheus.GaugeVec // node
	wedged               prometheus.Gauge
	fallbackActive       prometheus.Gauge
	fallbackActivations  *prometheus.CounterVec // rule, policy
	overshootBound       *prometheus.GaugeVec   // rule
	refunds              prometheus.Counter
	grpcPanics           prometheus.Counter
	rulesLoaded          prometheus.Gauge
	rulesReloads         *prometheus.CounterVec // result
	redisEvictionSafe    prometheus.Gauge
	replays              *prometheus.CounterVec // rule
	hotSubjects          prometheus.Gauge
	hotPromotions        prometheus.Counter
	hotMarks             *prometheus.CounterVec // verdict
	hotFull              prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_decisions_total",
			Help: "Per-rule decisions, by the path that decided (store, leased, fallback; cached: a denial the store's last answer for the bucket still made certain, decided without a script call (-local-denials); none: a shadow rule's denial of a request it could never admit, such as a cost over its burst, decided without a bucket), result (allowed, denied) and reason.",
		}, []string{"rule", "path", "result", "reason"}),
		noRule: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_decisions_no_rule_total",
			Help: "Requests that matched no rule and were admitted.",
		}),
		invalid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_requests_invalid_total",
			Help: "Requests rejected as malformed before touching any bucket.",
		}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ration_decision_duration_seconds",
			Help:    "Time to decide one request inside the agent (excluding the API transport), by the slowest path it used. An embedded limiter's Key decisions made on a lease are counted in ration_decisions_total but not timed here.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}, []string{"path"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_store_errors_total",
			Help: "Store calls that failed, by kind (timeout, canceled, unavailable, auth: Redis refused the credentials, refund, other; caller_gone: the caller hung up first, not counted against the store).",
		}, []string{"kind"}),
		breakerShortCircuits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_breaker_short_circuits_total",
			Help: "Store charges skipped because the circuit breaker was open.",
		}),
		breakerOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_breaker_open",
			Help: "1 while the store's circuit breaker is open (store known down; with a Redis Cluster, while any master's is), else 0.",
		}),
		breakerNodeOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ration_breaker_node_open",
			Help: "1 while the circuit breaker of one node of the store is open (its decisions follow their rules' failure policies at once), else 0; node is a Redis Cluster master's address (unserved: the slots no master serves), or primary for a single or Sentinel-managed primary.",
		}, []string{"node"}),
		fallbackNodeActive: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ration_fallback_node_active",
			Help: "1 while one node of the store is in an outage episode (its decisions follow their rules' failure policies; emergency allowances count from its start), else 0; node as in ration_breaker_node_open.",
		}, []string{"node"}),
		wedged: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_agent_wedged",
			Help: "1 while a decision has been in flight, or the lease renewal loop without a step, for longer than -stall-timeout: /healthz answers 503 so that the orchestrator restarts the agent; else 0.",
		}),
		fallbackActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_fallback_active",
			Help: "1 while a store outage episode is in progress and failure policies decide (with a Redis Cluster, on any master), else 0.",
		}),
		fallbackActivations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_fallback_activations_total",
			Help: "Failure-policy episodes per rule (counted once per outage episode, not per request).",
		}, []string{"rule", "policy"}),
		overshootBound: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ration_overshoot_bound_tokens",
			Help: "Worst-case tokens this agent may admit per bucket beyond the quota if the store is lost, under the rule's failure policy (+Inf for fail_open).",
		}, []string{"rule"}),
		grpcPanics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_grpc_panics_total",
			Help: "gRPC calls whose handler panicked; each was answered Internal and logged with its stack, and the process went on serving.",
		}),
		refunds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_refunds_total",
			Help: "Charges given back because another matching rule denied the request.",
		}),
		rulesLoaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_rules_loaded",
			Help: "Number of rules in force.",
		}),
		rulesReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_rules_reloads_total",
			Help: "Rules file reloads by result (ok, error); on error the previous rules stay in force.",
		}, []string{"result"}),
		redisEvictionSafe: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_redis_eviction_safe",
			Help: "1 if Redis maxmemory-policy is noeviction (buckets are never evicted silently), 0 otherwise.",
		}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_request_id_replays_total",
			Help: "Per-rule answers replayed from this agent's record of request ids (a retry through the same agent): nothing charged, not counted in ration_decisions_total.",
		}, []string{"rule"}),
		hotSubjects: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_agent_hot_subjects",
			Help: "Promoted subjects of mode auto rules this agent decides on leases now (their marks are live).",
		}),
		hotPromotions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_agent_hot_promotions_total",
			Help: "Promotions of mode auto subjects to leases this agent has taken up (one per subject and epoch).",
		}),
		hotMarks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_agent_hot_marks_total",
			Help: "Extensions of promoted subjects' marks in the store, by verdict: kept (extended), cool (cooled below demote_below: not extended), gone (the promotion is over), error (not answered; the mark runs out unless a later one lands).",
		}, []string{"verdict"}),
		hotFull: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_agent_hot_table_full_total",
			Help: "Promotions not taken up because this agent already spends on the most promoted subjects it tracks (10000): those decisions fall to the rule's failure policy.",
		}),
	}
	for _, v := range []string{"kept", "cool", "gone", "error"} {
		m.hotMarks.WithLabelValues(v) // every verdict exported from the start, at 0
	}
	reg.MustRegister(m.hotSubjects, m.hotPromotions, m.hotMarks, m.hotFull)
	reg.MustRegister(m.replays, m.decisions, m.noRule, m.invalid, m.duration, m.storeErrors, m.breakerShortCircuits,
		m.breakerOpen, m.breakerNodeOpen, m.fallbackNodeActive, m.wedged, m.fallbackActive, m.fallbackActivations, m.overshootBound, m.refunds, m.grpcPanics,
		m.rulesLoaded, m.rulesReloads, m.redisEvictionSafe)
	return m
}

type decisionKey struct {
	rule    string
	path    path
	allowed bool
	reason  Reason
}

// decision returns the decisions counter of one combination, cached: the
// label hashing of WithLabelValues would otherwise run for every rule of
// every request. The cache is bounded by rules x paths x reasons.
func (m *metrics) decision(rule string, p path, allowed bool, r Reason) prometheus.Counter {
	k := decisionKey{rule, p, allowed, r}
	if c, ok := m.decisionCache.Load(k); ok {
		return c.(prometheus.Counter)
	}
	result := "denied"
	if allowed {
		result = "allowed"
	}
	c := m.decisions.WithLabelValues(rule, p.String(), result, r.String())
	m.decisionCache.Store(k, c)
	return c
}

// ruleCounters are one rule's decisions counters, by path, result and
// reason, each resolved (WithLabelValues) at its first use: a series is
// exported once it has counted, as when every decision looked it up.
type ruleCounters [len(pathNames)][2][len(reasonNames)]atomic.Pointer[counterRef]

type counterRef struct{ prometheus.Counter }

type observerRef struct{ prometheus.Observer }

// ruleDecision is decision for a rule of the set in force: the counter
// held for the rule, found by its pointer. A rule of another set (one
// decided while a reload swaps the sets) goes through decision.
func (m *metrics) ruleDecision(r *rules.Rule, p path, allowed bool, reason Reason) prometheus.Counter {
	if t := m.byRule.Load(); t != nil && int(reason) < len(reasonNames) {
		if rc := (*t)[r]; rc != nil {
			res := 0
			if allowed {
				res = 1
			}
			slot := &rc[p][res][reason]
			if c := slot.Load(); c != nil {
				return c.Counter
			}
			c := m.decision(r.Name, p, allowed, reason)
			slot.Store(&counterRef{c})
			return c
		}
	}
	return m.decision(r.Name, p, allowed, reason)
}

// durationFor is duration's observer of path p, cached.
func (m *metrics) durationFor(p path) prometheus.Observer {
	slot := &m.durationOf[p]
	if o := slot.Load(); o != nil {
		return o.Observer
	}
	o := m.duration.WithLabelValues(p.String())
	slot.Store(&observerRef{o})
	return o
}

// forgetRules drops cached counters (after a reload, so removed rules'
// series are not kept alive by the cache) and makes room for the
// counters of set's rules.
func (m *metrics) forgetRules(set *rules.Set) {
	t := make(map[*rules.Rule]*ruleCounters, len(set.Rules()))
	for _, r := range set.Rules() {
		t[r] = new(ruleCounters)
	}
	m.byRule.Store(&t)
	m.decisionCache.Clear()
}

// warmupCounter is the optional part of Store that counts its warm-ups
// (bucket.RedisStore).
type warmupCounter interface {
	WarmupCounts() bucket.WarmupCounts
}

// warmupsCollector exports a store's warm-ups, read from the store at each
// scrape: it counts them itself, the agent's own included (the prober's).
type warmupsCollector struct {
	desc  *prometheus.Desc
	store warmupCounter
}

func newWarmupsCollector(store warmupCounter) warmupsCollector {
	return warmupsCollector{
		desc: prometheus.NewDesc("ration_store_warmups_total",
			"Store nodes warmed (scripts loaded, connections open) outside the warm-up at start, by cause: topology_read (a Redis Cluster master a failover or resharding brought in, warmed by the prober as soon as a topology read named it, before any decision went to it), first_decision (such a master warmed by the first decision routed to it, which waited for it), outage (a node warmed again after an outage, before its breaker closed), noscript (a call found the scripts gone, from a restart, failover or SCRIPT FLUSH no warm-up preceded, and reloaded them).",
			[]string{"cause"}, nil),
		store: store,
	}
}

func (c warmupsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c warmupsCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.store.WarmupCounts()
	for _, v := range []struct {
		cause string
		n     int64
	}{{"topology_read", n.TopologyRead}, {"first_decision", n.FirstDecision}, {"outage", n.Outage}, {"noscript", n.NoScript}} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(v.n), v.cause)
	}
}
