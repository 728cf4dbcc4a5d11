package admission

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"
)

func TestLogRoundTrip(t *testing.T) {
	in := []Record{
		{At: 123456789, Latency: 42, Agent: "a1", Quota: "ration:{r|alice}", Cost: 1.5, Allowed: true,
			Path: "store", Reason: "ok", RequestID: "req-1", Burst: 10, Rate: 2.5},
		{At: 2, Agent: "tab\there", Quota: "-", Cost: 1, Path: "leased", Reason: "over_limit", Lease: "7", Burst: 1, Rate: 0},
		{At: 3, Agent: `quote"back\slash`, Quota: "q\nnewline", Cost: 1, Allowed: true},
	}
	var buf []byte
	for i := range in {
		buf = AppendLine(buf, &in[i])
	}
	out, err := Read(bytes.NewReader(append([]byte("# comment\n\n"), buf...)))
	if err != nil {
		t.Fatalf("Read = %v", err)
	}
	if len(out) != len(in) {
		t.Fatalf("Read = %d records, want %d", len(out), len(in))
	}
	for i := range in {
		if out[i] != in[i] {
			t.Errorf("record %d = %+v, want %+v", i, out[i], in[i])
		}
	}
}

func TestReadRejectsMalformed(t *testing.T) {
	for _, bad := range []string{
		"1\t2\ta\tq\t1\t1\tstore\tok\t-\t-\t10\n",                    // 11 fields
		"x\t0\ta\tq\t1\t1\tstore\tok\t-\t-\t10\t1\n",                 // time
		"1\t0\ta\tq\t1\tyes\tstore\tok\t-\t-\t10\t1\n",               // allowed
		"1\t0\ta\tq\tNaNx\t1\tstore\tok\t-\t-\t10\t1\n",              // cost
		"1\t0\t\"unterminated\tq\t1\t1\tstore\tok\t-\t-\t10\t1\n",    // quoting
		"1\t0\ta\tq\t1\t1\tstore\tok\t-\t-\t10\t1\n1\t0\ta\tq\t1\t1", // torn last line
	} {
		if _, err := Read(strings.NewReader(bad)); err == nil {
			t.Errorf("Read(%q) = nil error, want one", bad)
		}
	}
}

// Histories that must fail the check, and ones that must pass, judged as
// a scenario judges them.
func TestJudge(t *testing.T) {
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	adm := func(at float64, cost float64) Record {
		return Record{At: sec(at), Quota: "q", Cost: cost, Allowed: true}
	}
	tests := []struct {
		name  string
		recs  []Record
		burst float64
		rate  float64
		bound float64
		pass  bool
		over  float64
	}{
		{"steady at the rate", []Record{adm(0, 10), adm(1, 10), adm(2, 10)}, 10, 10, 0, true, 0},
		{"two agents each spending the whole burst", []Record{adm(0, 10), adm(0.5, 10)}, 10, 1, 0, false, 9.5},
		{"within an emergency bound", []Record{adm(0, 10), adm(0.5, 10)}, 10, 1, 10, true, 9.5},
		{"denials never count", []Record{adm(0, 10), {At: 0, Quota: "q", Cost: 100}}, 10, 0, 0, true, 0},
		{"a retried request id counts once", []Record{
			{At: 0, Quota: "q", Cost: 6, Allowed: true, RequestID: "a"},
			{At: 1, Quota: "q", Cost: 6, Allowed: true, RequestID: "a"},
		}, 6, 0, 0, true, 0},
		{"distinct request ids both count", []Record{
			{At: 0, Quota: "q", Cost: 6, Allowed: true, RequestID: "a"},
			{At: 1, Quota: "q", Cost: 6, Allowed: true, RequestID: "b"},
		}, 6, 0, 0, false, 6},
		{"latency slack explains a late record", []Record{
			// charged at 0, its answer recorded 0.1s later; the next
			// charge, 1s after the first, looks 0.9s after it.
			{At: sec(0.1), Latency: sec(0.1), Quota: "q", Cost: 10, Allowed: true},
			{At: sec(1), Quota: "q", Cost: 1, Allowed: true},
		}, 10, 1, 0, true, 0.1},
		{"latency slack does not explain a real overshoot", []Record{
			{At: sec(0), Quota: "q", Cost: 10, Allowed: true},
			{At: sec(0.5), Latency: sec(0.01), Quota: "q", Cost: 5, Allowed: true},
		}, 10, 1, 0, false, 4.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := Judge(Check(tt.recs, "q", tt.burst, tt.rate), tt.bound)
			if v.Pass != tt.pass || math.Abs(v.Overshoot-tt.over) > 1e-9 {
				t.Fatalf("Judge = pass %v overshoot %v (slack %v), want pass %v overshoot %v",
					v.Pass, v.Overshoot, v.Slack, tt.pass, tt.over)
			}
		})
	}
}

func TestCheckAllUsesRecordedShapes(t *testing.T) {
	recs := []Record{
		{At: 0, Quota: "b", Cost: 3, Allowed: true, Burst: 2, Rate: 1},
		{At: 0, Quota: "a", Cost: 1, Allowed: true, Burst: 5, Rate: 1},
		{At: 0, Quota: "a", Cost: 1, Allowed: false, Burst: 5, Rate: 1},
	}
	reps := CheckAll(recs)
	if len(reps) != 2 || reps[0].Quota != "a" || reps[1].Quota != "b" {
		t.Fatalf("CheckAll = %+v, want quotas a then b", reps)
	}
	if reps[0].Overshoot != -4 || reps[0].Count != 1 {
		t.Fatalf("quota a = %+v, want overshoot -4 from 1 admission", reps[0])
	}
	if reps[1].Overshoot != 1 || reps[1].Burst != 2 {
		t.Fatalf("quota b = %+v, want overshoot 1 against burst 2", reps[1])
	}
}
