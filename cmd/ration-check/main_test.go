package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/buildinfo"
)

func writeLog(t *testing.T, recs ...admission.Record) string {
	t.Helper()
	var buf []byte
	for i := range recs {
		buf = admission.AppendLine(buf, &recs[i])
	}
	p := filepath.Join(t.TempDir(), "adm.log")
	if err := os.WriteFile(p, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Two agents' logs merge; the quota each agent spent in full is caught
// unless its bound allows it.
func TestRun(t *testing.T) {
	a := writeLog(t, admission.Record{At: 1e9, Agent: "a", Quota: "r|x", Cost: 10, Allowed: true, Burst: 10, Rate: 1})
	b := writeLog(t, admission.Record{At: 1e9 + 5e8, Agent: "b", Quota: "r|x", Cost: 10, Allowed: true, Burst: 10, Rate: 1})
	tests := []struct {
		args []string
		ok   bool
	}{
		{[]string{a}, true},
		{[]string{a, b}, false},
		{[]string{"-bound", "r|x=10", a, b}, true},
		{[]string{"-default-bound", "9", a, b}, false},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		ok, err := run(tt.args, &out, &errb)
		if err != nil {
			t.Fatalf("run(%q) = %v", tt.args, err)
		}
		if ok != tt.ok {
			t.Errorf("run(%q) = %v, want %v\n%s", tt.args, ok, tt.ok, out.String())
		}
		if !strings.Contains(out.String(), "r|x") {
			t.Errorf("run(%q) printed no row for r|x:\n%s", tt.args, out.String())
		}
	}
	if _, err := run(nil, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Error("run() with no logs = nil error, want one")
	}
}

func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	ok, err := run([]string{"-version"}, &stdout, &stderr)
	if err != nil || !ok {
		t.Fatalf("run(-version) = %v, %v", ok, err)
	}
	if want := "ration-check " + buildinfo.Get().String() + "\n"; stdout.String() != want {
		t.Fatalf("-version printed %q, want %q", stdout.String(), want)
	}
}
