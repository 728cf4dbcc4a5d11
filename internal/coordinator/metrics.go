package coordinator

import (
	"errors"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ration-dev/ration/internal/lease"
	"github.com/ration-dev/ration/internal/region"
	"github.com/ration-dev/ration/internal/rules"
)

// metrics are one node's ration_coordinator_* metrics. Labels are bounded:
// quotas are aggregated by rule (the rules file bounds rules), never
// labelled by subject.
type metrics struct {
	renewals       prometheus.Counter
	releases       prometheus.Counter
	reclaimed      prometheus.Counter
	entriesFailed  prometheus.Counter
	grpcPanics     prometheus.Counter
	leaderChanges  prometheus.Counter
	batchCommands  prometheus.Histogram
	batchRequests  prometheus.Histogram
	commitDuration prometheus.Histogram
	isLeader       prometheus.Gauge
	ready          prometheus.Gauge
	// upstreamRenewals counts a regional leader's renewals of its upstream
	// leases, by result (ok, error).
	upstreamRenewals *prometheus.CounterVec
	// upstreamClamped counts upstream grants held to the rule.
	upstreamClamped prometheus.Counter
	// upstreamLastOK is when this node last renewed upstream.
	upstreamLastOK prometheus.Gauge
	// nudges counts quotas this leader told holders to renew at once,
	// nudgesHeld the nudges its damping held back (planned again after the
	// cooldown); duplicateHolders pairs of live agent processes seen with
	// one id.
	nudges           prometheus.Counter
	nudgesHeld       prometheus.Counter
	duplicateHolders prometheus.Counter
	// incarnationsRefused counts grants refused by MaxIncarnations.
	incarnationsRefused prometheus.Counter
	// renewStreams counts the RenewStreams open on this node.
	renewStreams prometheus.Gauge
	// raftRefused counts Raft RPCs refused for the peer's identity
	// (raftpeers.go).
	raftRefused prometheus.CounterFunc
	state       *stateCollector

	all []prometheus.Collector
}

func newMetrics(n *Node) *metrics {
	m := &metrics{
		renewals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_coordinator_renewals_committed_total",
			Help: "Renew requests committed and applied by this node as leader.",
		}),
		releases: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_coordinator_releases_committed_total",
			Help: "Release requests committed and applied by this node as leader.",
		}),
		reclaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_coordinator_leases_reclaimed_total",
			Help: "Leases reclaimed after expiry plus safety margin (their unreturned tokens are lost), by ticks this node proposed.",
		}),
		grpcPanics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_grpc_panics_total",
			Help: "gRPC calls whose handler panicked; each was answered Internal and logged with its stack, and the process went on serving.",
		}),
		entriesFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_coordinator_entries_failed_total",
			Help: "Raft entries this node proposed that failed to commit (leadership lost, timeout); their requests were answered UNAVAILABLE.",
		}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_coordinator_leader_changes_total",
			Help: "Leader changes observed by this node (including to no leader).",
		}),
		batchCommands: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ration_coordinator_batch_commands",
			Help:    "Lease commands per Raft entry proposed by this node.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 13),
		}),
		batchRequests: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ration_coordinator_batch_requests",
			Help:    "Requests (renewals, releases, ticks) per Raft entry proposed by this node.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 13),
		}),
		commitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ration_coordinator_apply_duration_seconds",
			Help:    "Time from proposing an entry to its being committed and applied on the leader.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
		}),
		isLeader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_coordinator_leader",
			Help: "1 while this node is the Raft leader.",
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_coordinator_leader_ready",
			Help: "1 while this node leads and has applied its LeaderElected entry (it serves leases).",
		}),
		upstreamRenewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_coordinator_upstream_renewals_total",
			Help: "Renewals of this regional leader's upstream leases from the global group, by result (ok, error).",
		}, []string{"result"}),
		upstreamClamped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_coordinator_upstream_grants_clamped_total",
			Help: "Upstream grants this regional leader held to the rule's burst or rate because the global group granted more (a group that is not the fleet's global group, or other rules: logged).",
		}),
		upstreamLastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_coordinator_upstream_last_success_timestamp_seconds",
			Help: "When this node, as a regional leader, last renewed its upstream leases from the global group (Unix seconds; 0: never). The group's newest across its nodes, older than a lease period, is a region whose global rules are down to their safe shares.",
		}),
		nudges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_coordinator_nudges_total",
			Help: "Quotas this node, as leader, told their holders to renew at once over their Watch streams (a share to shrink or to take).",
		}),
		nudgesHeld: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_coordinator_nudges_held_total",
			Help: "Nudges this node, as leader, held back because it had nudged the same holder for the same quota within the cooldown (250ms) and the plan was not urgent; the quota is planned again when the cooldown ends. High next to ration_coordinator_nudges_total: shares of contended quotas churning.",
		}),
		duplicateHolders: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_coordinator_duplicate_agent_ids_total",
			Help: "Times this leader saw two live agent processes (incarnations) with the same configured agent id; each is still its own holder.",
		}),
		incarnationsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_coordinator_incarnations_refused_total",
			Help: "Renewals with grants this leader refused (RESOURCE_EXHAUSTED) because other incarnations of the holder's agent identity (certificate) hold leases already, as many as allowed (2): a certificate used by more processes than a restart explains.",
		}),
		renewStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_coordinator_renew_streams",
			Help: "RenewStreams open on this node: about one per agent (and regional group) connected to it. Agents of an earlier version, or agents that found this node without RenewStream, renew with unary calls and are not counted.",
		}),
		raftRefused: prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "ration_coordinator_raft_rpcs_refused_total",
			Help: "Raft RPCs this node refused, under TLS, because the peer's certificate does not name the member the RPC names, or that member is not in the Raft configuration at the address the RPC gives; each closed its connection. Not 0: a peer of another group, or a removed member, is calling.",
		}, func() float64 {
			if n.peers == nil {
				return 0
			}
			return float64(n.peers.refused.Load())
		}),
		state: &stateCollector{n: n},
	}
	m.all = []prometheus.Collector{
		m.renewals, m.releases, m.reclaimed, m.entriesFailed, m.grpcPanics, m.leaderChanges,
		m.batchCommands, m.batchRequests, m.commitDuration, m.isLeader, m.ready, m.upstreamRenewals, m.upstreamClamped, m.upstreamLastOK,
		m.nudges, m.nudgesHeld, m.duplicateHolders, m.incarnationsRefused, m.renewStreams, m.raftRefused, m.state,
	}
	return m
}

func (m *metrics) register(reg prometheus.Registerer) error {
	var errs []error
	for _, c := range m.all {
		errs = append(errs, reg.Register(c))
	}
	return errors.Join(errs...)
}

func (m *metrics) unregister(reg prometheus.Registerer) {
	for _, c := range m.all {
		reg.Unregister(c)
	}
}

// stateCollector reads the replicated state and Raft's statistics at
// scrape time, so the series are never stale and need no bookkeeping on
// the apply path.
type stateCollector struct{ n *Node }

var (
	descPool = prometheus.NewDesc("ration_coordinator_quota_pool_tokens",
		"Unassigned tokens P, summed over the rule's quotas (as of each quota's last refill).", []string{"rule"}, nil)
	descLeasedCap = prometheus.NewDesc("ration_coordinator_quota_leased_cap_tokens",
		"Reserved lease caps sum(b_i), summed over the rule's quotas.", []string{"rule"}, nil)
	descLeasedRate = prometheus.NewDesc("ration_coordinator_quota_leased_rate_tokens_per_second",
		"Reserved lease rates sum(r_i), summed over the rule's quotas.", []string{"rule"}, nil)
	descBurst = prometheus.NewDesc("ration_coordinator_quota_burst_tokens",
		"Burst B, summed over the rule's quotas: the bound of pool plus leased caps.", []string{"rule"}, nil)
	descQuotas = prometheus.NewDesc("ration_coordinator_quotas",
		"Leased quotas (rule, subject) in the replicated state, by rule.", []string{"rule"}, nil)
	descLeases = prometheus.NewDesc("ration_coordinator_leases",
		"Live leases in the replicated state, by rule.", []string{"rule"}, nil)
	descFunded = prometheus.NewDesc("ration_coordinator_quota_funded_burst_tokens",
		"What upstream leases add to the rule's funded quotas (a regional group), summed: the rest of ration_coordinator_quota_burst_tokens is the safe shares.", []string{"rule"}, nil)
	descOvershootRate = prometheus.NewDesc("ration_coordinator_safe_overshoot_tokens_per_second",
		"Worst-case overshoot rate of a scope: global, mode: leased rule while its regions are cut off from the global group: sum(safe shares) - rate when positive (allow_overshoot), else 0.", []string{"rule"}, nil)
	descOvershootBurst = prometheus.NewDesc("ration_coordinator_safe_overshoot_tokens",
		"Worst-case overshoot of a global leased rule's burst by its regions' safe bursts (sum(safe bursts) - burst when positive, else 0): the bound over a partition of length T is this plus the rate gauge times T.", []string{"rule"}, nil)
	descTuning = prometheus.NewDesc("ration_coordinator_tuning",
		"Operators' run-time tunings in the replicated state, by rule, region (\"\" = default) and setting (lease_period_seconds, renew_at, min_slice, max_slice, weight, safe_share, safe_share_pending_from).", []string{"rule", "region", "setting"}, nil)
	descRestores = prometheus.NewDesc("ration_coordinator_snapshot_restores_total",
		"Snapshots restored into the state machine (from disk at start, or installed from the leader).", nil, nil)
	descStopped = prometheus.NewDesc("ration_coordinator_fsm_stopped",
		"1 if the state machine stopped on an entry it cannot apply (the node shuts down).", nil, nil)
	descRaftState = prometheus.NewDesc("ration_coordinator_raft_state",
		"1 for the node's current Raft state.", []string{"state"}, nil)
	raftStats = []struct {
		key  string
		desc *prometheus.Desc
	}{
		{"term", prometheus.NewDesc("ration_coordinator_raft_term", "Current Raft term.", nil, nil)},
		{"commit_index", prometheus.NewDesc("ration_coordinator_raft_commit_index", "Raft commit index.", nil, nil)},
		{"applied_index", prometheus.NewDesc("ration_coordinator_raft_applied_index", "Last Raft index applied to the state machine.", nil, nil)},
		{"last_log_index", prometheus.NewDesc("ration_coordinator_raft_last_log_index", "Last Raft log index.", nil, nil)},
		{"last_snapshot_index", prometheus.NewDesc("ration_coordinator_raft_last_snapshot_index", "Index of the last snapshot.", nil, nil)},
		{"fsm_pending", prometheus.NewDesc("ration_coordinator_raft_fsm_pending", "Committed entries waiting to be applied.", nil, nil)},
		{"num_peers", prometheus.NewDesc("ration_coordinator_raft_peers", "Other voters in the Raft configuration.", nil, nil)},
	}
	raftStates = []string{"Follower", "Candidate", "Leader", "Shutdown"}

	// The members' health as this node sees it (health.go), labelled by
	// member: one series per server of the configuration.
	descMemberUp = prometheus.NewDesc("ration_coordinator_member_up",
		"1 while the member answers this node's probes of its admin port (and for this node itself), 0 once 2 probes in a row failed; absent while not known (not probed yet, or no admin address recorded).", []string{"member"}, nil)
	descMemberContact = prometheus.NewDesc("ration_coordinator_member_last_contact_seconds",
		"Seconds since the member last answered this node's probe (0 for this node itself); absent before its first answer.", []string{"member"}, nil)
	descMemberLag = prometheus.NewDesc("ration_coordinator_member_lag_entries",
		"Raft entries the member had not applied of those this node had committed, at its latest answer (for this node: committed, not yet applied).", []string{"member"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPool, descLeasedCap, descLeasedRate, descBurst, descFunded, descOvershootRate, descOvershootBurst, descTuning, descQuotas, descLeases, descRestores, descStopped, descRaftState, descMemberUp, descMemberContact, descMemberLag} {
		ch <- d
	}
	for _, s := range raftStats {
		ch <- s.desc
	}
}

type ruleSums struct {
	pool, cap, rate, burst, funded float64
	quotas, leases                 int
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.n
	byRule := map[string]*ruleSums{}
	n.fsm.read(func(s *lease.State) {
		for _, t := range s.Tunings() {
			emit := func(setting string, v float64) {
				ch <- prometheus.MustNewConstMetric(descTuning, prometheus.GaugeValue, v, t.Rule, t.Region, setting)
			}
			if t.LeasePeriod != 0 {
				emit("lease_period_seconds", float64(t.LeasePeriod)/1e6)
			}
			if t.RenewAt != 0 {
				emit("renew_at", t.RenewAt)
			}
			if t.MinSlice != nil {
				emit("min_slice", *t.MinSlice)
			}
			if t.MaxSlice != nil {
				emit("max_slice", *t.MaxSlice)
			}
			if t.Weight != 0 {
				emit("weight", t.Weight)
			}
			if t.SafeShare != nil {
				emit("safe_share", *t.SafeShare)
			}
			if t.SafePrev != nil {
				emit("safe_share_pending_from", *t.SafePrev)
			}
		}
		for _, name := range s.Quotas() {
			q, _ := s.Quota(name)
			rule, _, _ := strings.Cut(name, "|")
			r := byRule[rule]
			if r == nil {
				r = &ruleSums{}
				byRule[rule] = r
			}
			r.pool += q.Pool
			r.cap += q.ReservedCap
			r.rate += q.ReservedRate
			r.burst += q.Effective().Burst
			r.funded += q.Fund.Burst
			r.quotas++
			r.leases += q.Leases
		}
	})
	if set := n.rules.Load(); set != nil {
		for _, r := range set.Rules() {
			if r.Scope != region.ScopeGlobal || r.Mode != rules.ModeLeased {
				continue
			}
			ws := r.Regions
			if n.cfg.Upstream == "" {
				ws = n.countedRegions(r) // the tuned safe shares, counted as the global group counts them
			}
			o := region.Overshoot(r.Burst, r.Rate, ws)
			ch <- prometheus.MustNewConstMetric(descOvershootRate, prometheus.GaugeValue, o.Rate, r.Name)
			ch <- prometheus.MustNewConstMetric(descOvershootBurst, prometheus.GaugeValue, o.Burst, r.Name)
		}
	}
	for rule, r := range byRule {
		ch <- prometheus.MustNewConstMetric(descPool, prometheus.GaugeValue, r.pool, rule)
		ch <- prometheus.MustNewConstMetric(descLeasedCap, prometheus.GaugeValue, r.cap, rule)
		ch <- prometheus.MustNewConstMetric(descLeasedRate, prometheus.GaugeValue, r.rate, rule)
		ch <- prometheus.MustNewConstMetric(descBurst, prometheus.GaugeValue, r.burst, rule)
		ch <- prometheus.MustNewConstMetric(descFunded, prometheus.GaugeValue, r.funded, rule)
		ch <- prometheus.MustNewConstMetric(descQuotas, prometheus.GaugeValue, float64(r.quotas), rule)
		ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(r.leases), rule)
	}
	ch <- prometheus.MustNewConstMetric(descRestores, prometheus.CounterValue, float64(n.fsm.Restores()))
	stopped := 0.0
	if n.fsm.Stopped() != nil {
		stopped = 1
	}
	ch <- prometheus.MustNewConstMetric(descStopped, prometheus.GaugeValue, stopped)
	if n.raft == nil {
		return
	}
	st := n.raft.State().String()
	for _, s := range raftStates {
		v := 0.0
		if s == st {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descRaftState, prometheus.GaugeValue, v, s)
	}
	if servers, err := n.servers(); err == nil {
		now := n.clock()
		for _, m := range n.memberStatuses(servers) {
			switch m.Health {
			case healthSelf, healthReachable:
				ch <- prometheus.MustNewConstMetric(descMemberUp, prometheus.GaugeValue, 1, m.ID)
			case healthUnreachable:
				ch <- prometheus.MustNewConstMetric(descMemberUp, prometheus.GaugeValue, 0, m.ID)
			}
			switch {
			case m.Health == healthSelf:
				ch <- prometheus.MustNewConstMetric(descMemberContact, prometheus.GaugeValue, 0, m.ID)
			case !m.LastContact.IsZero():
				ch <- prometheus.MustNewConstMetric(descMemberContact, prometheus.GaugeValue, max(now.Sub(m.LastContact).Seconds(), 0), m.ID)
			}
			if m.Health == healthSelf || !m.LastContact.IsZero() {
				ch <- prometheus.MustNewConstMetric(descMemberLag, prometheus.GaugeValue, float64(m.Lag), m.ID)
			}
		}
	}
	stats := n.raft.Stats()
	for _, s := range raftStats {
		if v, err := strconv.ParseFloat(stats[s.key], 64); err == nil {
			ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, v)
		}
	}
}
