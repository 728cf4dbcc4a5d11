package agent

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ration-dev/ration/internal/rules"
)

// The decision counters held per rule count into the series their labels
// name, across a reload (new rule pointers, same names) and for a rule of
// a set the table was not built for.
func TestRuleDecisionCounters(t *testing.T) {
	const yaml = `
rules:
  - name: a
    match: {k: "*"}
    burst: 10
    rate: 1
  - name: b
    match: {j: "*"}
    burst: 10
    rate: 1
`
	parse := func() *rules.Set {
		set, err := rules.Parse("rules.yaml", []byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		return set
	}
	m := newMetrics(prometheus.NewRegistry())
	old := parse()
	m.forgetRules(old)
	a, _ := old.Rule("a")
	b, _ := old.Rule("b")
	for range 2 {
		m.ruleDecision(a, pathLeased, true, ReasonOK).Inc()
	}
	m.ruleDecision(a, pathLeased, false, ReasonOverLimit).Inc()
	m.ruleDecision(b, pathRedis, true, ReasonOK).Inc()
	m.ruleDecision(a, pathFallback, true, ReasonUnavailable).Inc()  // fail_open
	m.ruleDecision(a, pathFallback, false, ReasonUnavailable).Inc() // fail_closed

	cur := parse()
	m.forgetRules(cur)
	a2, _ := cur.Rule("a")
	m.ruleDecision(a2, pathLeased, true, ReasonOK).Inc()
	m.ruleDecision(a, pathLeased, true, ReasonOK).Inc() // a rule no longer in force

	for _, c := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"a", "leased", "allowed", "ok"}, 4},
		{[]string{"a", "leased", "denied", "over_limit"}, 1},
		{[]string{"a", "fallback", "allowed", "unavailable"}, 1},
		{[]string{"a", "fallback", "denied", "unavailable"}, 1},
		{[]string{"b", "store", "allowed", "ok"}, 1},
		{[]string{"b", "leased", "allowed", "ok"}, 0},
	} {
		if got := testutil.ToFloat64(m.decisions.WithLabelValues(c.labels...)); got != c.want {
			t.Errorf("ration_decisions_total%v = %v, want %v", c.labels, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.decisions); n != 6 { // the five counted, and the zero made above
		t.Errorf("%d series exported, want 6", n)
	}
}
