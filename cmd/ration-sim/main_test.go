package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBadArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-config", "huge"}, `-config "huge": want small or reference`},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-seed", "x"}, `invalid value "x" for flag -seed`},
		{[]string{"-duration", "500ms"}, "at least 10 steps"},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != 2 {
			t.Errorf("%q: exit %d, want 2", tc.args, code)
		}
		if !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%q: stderr %q, want it to say %q", tc.args, errb.String(), tc.want)
		}
		if out.Len() != 0 {
			t.Errorf("%q: printed a report: %q", tc.args, out.String())
		}
	}
}

// A short run writes its report and both plots, and exits 0 when the
// bounds held.
func TestRunWritesReportAndPlots(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	code := run([]string{"-config", "small", "-seed", "5", "-duration", "20s", "-out", dir}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "verdict: PASS") || !strings.Contains(out.String(), "replay: go run ./cmd/ration-sim -config small -seed 5") {
		t.Fatalf("report:\n%s", out.String())
	}
	for _, name := range []string{"report.txt", "admitted.svg", "load.svg"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || len(b) == 0 {
			t.Fatalf("%s: %v (%d bytes)", name, err, len(b))
		}
	}
	report, _ := os.ReadFile(filepath.Join(dir, "report.txt"))
	if string(report) != out.String() {
		t.Fatal("report.txt differs from the report printed")
	}
}
