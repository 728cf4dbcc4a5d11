package rlqs

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	assignments *prometheus.CounterVec
	lent        prometheus.Counter
	returned    prometheus.Counter
	forfeit     prometheus.Counter
	buckets     prometheus.Gauge
	streams     prometheus.Gauge
	refused     *prometheus.CounterVec
	takes       *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		assignments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_rlqs_assignments_total",
			Help: "Bucket actions sent to Envoy RLQS clients, by kind (token_bucket, allow_all, deny_all, abandon).",
		}, []string{"kind"}),
		lent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_rlqs_tokens_reserved_total",
			Help: "Lease tokens reserved (lent) for RLQS token bucket assignments: each assignment's max_tokens (its refill is lent as rate, ration_rlqs_rate_tokens_total).",
		}),
		returned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_rlqs_tokens_returned_total",
			Help: "Reserved tokens given back to their lease because Envoy provably never spent them (a replaced assignment's rest, or a settled one's unused part).",
		}),
		forfeit: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ration_rlqs_tokens_ended_total",
			Help: "Reserved tokens whose reservation ended without being given back: spent by Envoy, or not provably unspent.",
		}),
		buckets: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_rlqs_active_buckets",
			Help: "RLQS buckets the agent tracks over all streams.",
		}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ration_rlqs_streams",
			Help: "Open RLQS streams.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_rlqs_refused_total",
			Help: "RLQS streams ended by the agent, by reason (invalid: a report broke the protocol or a bound; streams: too many streams; client_streams: too many streams on one connection; silent: no report in time; buckets: too many buckets on one stream; unread: Envoy took no response for the send timeout).",
		}, []string{"reason"}),
		takes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ration_rlqs_takes_total",
			Help: "Takes asked for to fund RLQS assignments of rules RLQS does not lend for (mode redis, mode auto, lease.default_share): each asks the agent's decisions for an assignment's whole cost, by outcome (funded; open: admitted by fail_open, nothing charged; over_limit: the quota lacks it, then asked once more, smaller; unavailable: denied by the failure policy; gone: the rule was reloaded away; error: refused, the rule is not enforced; late: funded, but the assignment could not be sent within 250ms of its take, so a 1s DENY_ALL went instead, counted besides its funded outcome).",
		}, []string{"outcome"}),
	}
	// Every series exists from the start, at 0: a dashboard's rate() of a
	// kind that has not happened yet is 0, not missing.
	for _, k := range []string{"token_bucket", "allow_all", "deny_all", "abandon"} {
		m.assignments.WithLabelValues(k)
	}
	for _, r := range []string{"invalid", "streams", "client_streams", "silent", "buckets"} {
		m.refused.WithLabelValues(r)
	}
	for _, o := range []string{"funded", "open", "over_limit", "unavailable", "gone", "error"} {
		m.takes.WithLabelValues(o)
	}
	reg.MustRegister(m.assignments, m.lent, m.returned, m.forfeit, m.buckets, m.streams, m.refused, m.takes)
	return m
}
