package envflag

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

type cfg struct {
	S string
	B bool
	I int
	U uint64
	F float64
	D time.Duration
	N string // flag only
}

func (c *cfg) settings() []Setting {
	return []Setting{
		{"s", "S", "a string", &c.S},
		{"b", "B", "a bool", &c.B},
		{"i", "I", "an int", &c.I},
		{"u", "U", "a uint", &c.U},
		{"f", "F", "a float", &c.F},
		{"d", "D", "a duration", &c.D},
		{"n", "", "flag only", &c.N},
	}
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestLayering(t *testing.T) {
	c := cfg{S: "default", I: 1}
	if err := Load("X_", c.settings(), env(map[string]string{
		"X_S": "env", "X_B": "true", "X_I": "7", "X_U": "9", "X_F": "2.5", "X_D": "3s", "X_N": "ignored",
	})); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	Bind(fs, "X_", c.settings())
	if err := fs.Parse([]string{"-i", "8", "-n", "flag"}); err != nil {
		t.Fatal(err)
	}
	want := cfg{S: "env", B: true, I: 8, U: 9, F: 2.5, D: 3 * time.Second, N: "flag"}
	if c != want {
		t.Fatalf("after env and flags: %+v, want %+v", c, want)
	}
	var usage strings.Builder
	fs.SetOutput(&usage)
	fs.PrintDefaults()
	if !strings.Contains(usage.String(), "(env X_D)") || strings.Contains(usage.String(), "X_N") {
		t.Fatalf("usage does not name the variables exactly:\n%s", usage.String())
	}
}

func TestLoadReportsEveryBadValue(t *testing.T) {
	c := cfg{I: 1}
	err := Load("X_", c.settings(), env(map[string]string{"X_B": "maybe", "X_I": "x", "X_D": "soon", "X_F": "pi"}))
	for _, v := range []string{"X_B", "X_I", "X_D", "X_F"} {
		if err == nil || !strings.Contains(err.Error(), v) {
			t.Errorf("Load = %v, want %s named", err, v)
		}
	}
	if c.I != 1 {
		t.Fatalf("a malformed value changed the field: I = %d", c.I)
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	Bind(fs, "X_", c.settings())
}
