package agent_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/rules"
)

// Every decision of a batch lands in the log, with its final verdict, and
// the checker reads it back.
func TestRecording(t *testing.T) {
	set, err := rules.Parse("record.yaml", []byte(`
rules:
  - name: r
    match: {user: "*"}
    burst: 2
    rate: 0
`))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := agent.New(agent.Options{Rules: agent.StaticRules{Set: set}, Store: bucket.NewMemoryStore(nil), DecisionTimeout: 50e6})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "adm.log")
	stop, err := svc.StartRecording(path, "agent-1")
	if err != nil {
		t.Fatal(err)
	}
	reqs := []agent.Request{
		{Rule: "r", Subject: "alice", RequestID: "a"},
		{Rule: "r", Subject: "alice", RequestID: "b"},
		{Rule: "r", Subject: "alice", RequestID: "c"},
	}
	out := make([]agent.Response, len(reqs))
	errs := make([]error, len(reqs))
	svc.DecideBatch(context.Background(), reqs, out, errs)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	recs := readLog(t, path)
	if len(recs) != 3 {
		t.Fatalf("recorded %d decisions, want 3: %+v", len(recs), recs)
	}
	for i, r := range recs {
		if r.Agent != "agent-1" || r.Quota != "r|alice" || r.Allowed != out[i].Allowed || r.RequestID != reqs[i].RequestID ||
			r.Burst != 2 || r.Path != "store" || r.At <= 0 {
			t.Errorf("record %d = %+v, want agent-1 r|alice allowed=%v path store", i, r, out[i].Allowed)
		}
	}
	reps := admission.CheckAll(recs)
	if len(reps) != 1 || reps[0].Admitted != 2 || reps[0].Overshoot != 0 {
		t.Fatalf("CheckAll = %+v, want 2 admitted at overshoot 0", reps)
	}
}

// A scope: global, mode: redis rule is enforced per region as the
// region's weighted share, and recorded with that share: a checker
// (ration-check) given the rule's whole shape would judge each region's
// admissions against the global budget, far too loosely.
func TestRecordingGlobalRedisShare(t *testing.T) {
	set, err := rules.Parse("record.yaml", []byte(globalSplitRule))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := agent.New(agent.Options{Rules: agent.StaticRules{Set: set}, Store: bucket.NewMemoryStore(nil), DecisionTimeout: 50e6, Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "adm.log")
	stop, err := svc.StartRecording(path, "agent-eu")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Decide(context.Background(), agent.Request{Descriptors: map[string]string{"user": "u"}}); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	recs := readLog(t, path)
	if len(recs) != 1 || recs[0].Burst != 200 || recs[0].Rate != 0 {
		t.Fatalf("records %+v; want one, with eu's share (burst 200 of 300: weight 2 of 3)", recs)
	}
}

// The recorder's cost per decision: a batch of 100 decisions against the
// in-memory store, with and without -record.
func BenchmarkRecording(b *testing.B) {
	set, err := rules.Parse("record.yaml", []byte("rules:\n  - {name: r, match: {user: \"*\"}, burst: 1e9, rate: 1e9}\n"))
	if err != nil {
		b.Fatal(err)
	}
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			svc, err := agent.New(agent.Options{Rules: agent.StaticRules{Set: set}, Store: bucket.NewMemoryStore(nil), DecisionTimeout: 50e6})
			if err != nil {
				b.Fatal(err)
			}
			if on {
				stop, err := svc.StartRecording(filepath.Join(b.TempDir(), "adm.log"), "bench")
				if err != nil {
					b.Fatal(err)
				}
				defer stop()
			}
			reqs := make([]agent.Request, 100)
			for i := range reqs {
				reqs[i] = agent.Request{Rule: "r", Subject: "s" + string(rune('a'+i%26))}
			}
			out := make([]agent.Response, len(reqs))
			errs := make([]error, len(reqs))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				svc.DecideBatch(context.Background(), reqs, out, errs)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(reqs)), "ns/decision")
		})
	}
}
