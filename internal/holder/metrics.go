package holder

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	renewals      *prometheus.CounterVec
	renewalsOK    prometheus.Counter // renewals{result="ok"}, once it exists
	renewalsErr   prometheus.Counter // renewals{result="error"}, once it exists
	renewDuration prometheus.Histogram
	granted       prometheus.Counter
	returned      prometheus.Counter
	expired       prometheus.Counter
	quotas        prometheus.Gauge
	nudges        prometheus.Counter
	demoted       prometheus.Counter
	unreleased    prometheus.Counter
	clamped       prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_agent_lease_renewals_total",
			Help: "Renew calls to the coordinators (one per round, carrying every lease of this agent), by result.",
		}, []string{"result"}),
		renewDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ration_agent_lease_renew_duration_seconds",
			Help:    "Time from sending a Renew to its answer (includes the Raft commit).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		granted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_agent_lease_tokens_granted_total",
			Help: "Tokens moved into this agent's leases by grants and top-ups.",
		}),
		returned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_agent_lease_tokens_returned_total",
			Help: "Unused tokens this agent gave back on release.",
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_agent_lease_expired_total",
			Help: "Leases the coordinator reported expired or unknown (asked for again).",
		}),
		quotas: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_agent_leased_quotas",
			Help: "Leased quotas (rule and subject) this agent holds or is acquiring.",
		}),
		nudges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_agent_lease_nudges_total",
			Help: "Quotas the coordinator leader asked this agent to renew at once (a share to shrink or to take).",
		}),
		demoted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_agent_lease_own_released_total",
			Help: "Subjects' own leases given back because their copy of the rule's default lease (lease.default_share) paid for every decision for a lease period (at most a minute).",
		}),
		unreleased: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_agent_lease_unreleased_total",
			Help: "Leases left to expire instead of released (idle, or at shutdown) because an Envoy RLQS assignment may still spend tokens lent from them; their unused tokens are forfeit.",
		}),
		clamped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_agent_lease_grants_clamped_total",
			Help: "Grants held to the rule's burst or rate because a coordinator granted more (a coordinator of another group, or other rules: logged).",
		}),
	}
	reg.MustRegister(m.renewals, m.renewDuration, m.granted, m.returned, m.expired, m.quotas, m.nudges, m.demoted, m.unreleased, m.clamped)
	return m
}

// renewed is renewals' counter for result ("ok" or "error"), looked up once:
// a label lookup hashes the value at every call. The series is created at
// its first count, not before, so that a scrape shows result="error" only
// once a renewal has failed. Only the round (one at a time) calls it.
func (m *metrics) renewed(result string) prometheus.Counter {
	c := &m.renewalsOK
	if result != "ok" {
		c = &m.renewalsErr
	}
	if *c == nil {
		*c = m.renewals.WithLabelValues(result)
	}
	return *c
}
