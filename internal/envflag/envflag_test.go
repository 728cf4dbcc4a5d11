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
		{Flag: "s", Env: "S", Usage: "a string", Value: &c.S},
		{Flag: "b", Env: "B", Usage: "a bool", Value: &c.B},
		{Flag: "i", Env: "I", Usage: "an int", Value: &c.I},
		{Flag: "u", Env: "U", Usage: "a uint", Value: &c.U},
		{Flag: "f", Env: "F", Usage: "a float", Value: &c.F},
		{Flag: "d", Env: "D", Usage: "a duration", Value: &c.D},
		{Flag: "n", Env: "", Usage: "flag only", Value: &c.N},
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

// Describe reads back what Bind registered: the variable, the default (the
// field's value when bound), the usage without the variable, and the
// argument name -h shows.
func TestDescribe(t *testing.T) {
	c := cfg{S: "x", D: 2 * time.Second}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	Bind(fs, "X_", c.settings())
	fs.Bool("version", false, "print the version")
	got := Describe(fs)
	want := []Flag{
		{Name: "b", Arg: "", Env: "X_B", Default: "false", Usage: "a bool"},
		{Name: "d", Arg: "duration", Env: "X_D", Default: "2s", Usage: "a duration"},
		{Name: "f", Arg: "float", Env: "X_F", Default: "0", Usage: "a float"},
		{Name: "i", Arg: "int", Env: "X_I", Default: "0", Usage: "an int"},
		{Name: "n", Arg: "string", Env: "", Default: "", Usage: "flag only"},
		{Name: "s", Arg: "string", Env: "X_S", Default: "x", Usage: "a string"},
		{Name: "u", Arg: "uint", Env: "X_U", Default: "0", Usage: "a uint"},
		{Name: "version", Arg: "", Env: "", Default: "false", Usage: "print the version"},
	}
	if len(got) != len(want) {
		t.Fatalf("Describe = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Describe[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// A setting with Redact, from its variable, is printed redacted as the
// default -h shows, and in Load's error; its value is the variable's.
func TestRedactedDefault(t *testing.T) {
	var secret int
	v := "url-with-hunter2"
	settings := []Setting{
		{Flag: "p", Env: "P", Usage: "a URL with a password", Value: &v, Redact: func(string) string { return "xxxxx" }},
		{Flag: "q", Env: "Q", Usage: "a number that may be secret", Value: &secret, Redact: func(string) string { return "xxxxx" }},
	}
	err := Load("X_", settings, env(map[string]string{"X_P": "url-with-hunter3", "X_Q": "hunter4"}))
	if err == nil || strings.Contains(err.Error(), "hunter4") {
		t.Errorf("Load = %v, want the malformed X_Q refused without its value", err)
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	Bind(fs, "X_", settings)
	var usage strings.Builder
	fs.SetOutput(&usage)
	fs.PrintDefaults()
	if strings.Contains(usage.String(), "hunter") || !strings.Contains(usage.String(), `(default "xxxxx")`) {
		t.Errorf("usage shows the secret default:\n%s", usage.String())
	}
	if v != "url-with-hunter3" {
		t.Errorf("value %q, want the variable's", v)
	}
}
