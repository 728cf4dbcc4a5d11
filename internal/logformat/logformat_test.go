package logformat

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Format
		ok   bool
	}{
		{"text", Text, true}, {"TEXT", Text, true}, {"json", JSON, true}, {"Json", JSON, true},
		{"", 0, false}, {"logfmt", 0, false}, {"xml", 0, false}, {" json", 0, false},
	} {
		got, err := Parse(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("Parse(%q) = %v, %v; want %v (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "text or json") {
			t.Errorf("Parse(%q) error %q does not say what is accepted", tc.in, err)
		}
	}
}

// json writes one object per record with the standard keys; text writes
// key=value pairs; both drop records below the level.
func TestNew(t *testing.T) {
	var b bytes.Buffer
	l := New(&b, JSON, slog.LevelInfo)
	l.Debug("hidden")
	l.Info("rules reloaded", "rules", 3)
	var rec map[string]any
	if err := json.Unmarshal(b.Bytes(), &rec); err != nil {
		t.Fatalf("json output %q: %v", b.String(), err)
	}
	if rec["msg"] != "rules reloaded" || rec["level"] != "INFO" || rec["rules"] != 3.0 || rec["time"] == nil {
		t.Errorf("json record = %v", rec)
	}
	b.Reset()
	New(&b, Text, slog.LevelWarn).Info("hidden")
	New(&b, Text, slog.LevelInfo).Info("rules reloaded", "rules", 3)
	if out := b.String(); !strings.Contains(out, `level=INFO msg="rules reloaded" rules=3`) || strings.Contains(out, "hidden") {
		t.Errorf("text output = %q", out)
	}
}
