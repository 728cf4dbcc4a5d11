package docgen

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ration-dev/ration/internal/envflag"
)

func TestTable(t *testing.T) {
	got := Table([]string{"a", "b"}, [][]string{{"x|y", ""}, {"two\nlines", Code("c")}})
	want := "| a | b |\n| --- | --- |\n| x\\|y | |\n| two lines | `c` |\n"
	if got != want {
		t.Fatalf("Table = %q, want %q", got, want)
	}
}

func TestReplace(t *testing.T) {
	doc := "intro\n<!-- t:begin -->\nold\n<!-- t:end -->\noutro\n"
	out, old, err := Replace(doc, "t", "new")
	if err != nil || out != "intro\n<!-- t:begin -->\nnew\n<!-- t:end -->\noutro\n" || old != "old\n" {
		t.Fatalf("Replace = %q, %q, %v", out, old, err)
	}
	for _, bad := range []string{"no markers", "<!-- t:begin --> no end", "<!-- t:begin --><!-- t:end --><!-- t:begin -->"} {
		if _, _, err := Replace(bad, "t", "x"); err == nil {
			t.Errorf("Replace(%q) succeeded", bad)
		}
	}
}

// Check fails on drift and, with update, rewrites only the part.
func TestCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "doc.md")
	if err := os.WriteFile(path, []byte("prose\n<!-- t:begin -->\nold\n<!-- t:end -->\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{TB: t}
	Check(rec, path, "t", "new\n", false)
	if !rec.failed || !strings.Contains(rec.msg, "- old") || !strings.Contains(rec.msg, "+ new") {
		t.Fatalf("Check on drift: failed %v, message %q", rec.failed, rec.msg)
	}
	Check(t, path, "t", "new\n", true)
	b, _ := os.ReadFile(path)
	if string(b) != "prose\n<!-- t:begin -->\nnew\n<!-- t:end -->\n" {
		t.Fatalf("after -update: %q", b)
	}
	Check(t, path, "t", "new\n", false)
}

type recorder struct {
	testing.TB
	failed bool
	msg    string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.failed = true
	r.msg = strings.TrimSpace(r.msg + "\n" + fmt.Sprintf(format, args...))
}

func TestFlagTable(t *testing.T) {
	host, _ := os.Hostname()
	if host == "" {
		t.Skip("no host name")
	}
	var id, rules string
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	envflag.Bind(fs, "X_", []envflag.Setting{
		{Flag: "id", Env: "ID", Usage: "the id", Value: &id},
		{Flag: "rules", Env: "RULES", Usage: "rules file; a|b", Value: &rules},
	})
	id = host
	fs.Lookup("id").DefValue = host
	fs.Bool("version", false, "print the version")
	want := "| flag | environment | default | meaning |\n| --- | --- | --- | --- |\n" +
		"| `-id string` | `X_ID` | host name | the id |\n" +
		"| `-rules string` | `X_RULES` | | rules file; a\\|b |\n" +
		"| `-version` | | `false` | print the version |\n"
	if got := FlagTable(fs); got != want {
		t.Fatalf("FlagTable =\n%s\nwant\n%s", got, want)
	}
}
