// Package docgen keeps the generated parts of the Markdown docs in step
// with the code. A generated part sits between two marker comments,
//
//	<!-- NAME:begin -->
//	...
//	<!-- NAME:end -->
//
// and a test renders it from the code: the test fails while the file
// differs, and run with -update (make docs) it rewrites the part. The
// prose around the markers is never touched.
package docgen

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// Table renders a Markdown table. A "|" in a cell is escaped and a
// newline becomes a space, so every row stays one line.
func Table(header []string, rows [][]string) string {
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("|")
		for _, c := range cells {
			c = strings.ReplaceAll(c, "|", `\|`)
			c = strings.Join(strings.Fields(c), " ")
			if c == "" {
				b.WriteString(" |")
				continue
			}
			b.WriteString(" " + c + " |")
		}
		b.WriteString("\n")
	}
	line(header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = "---"
	}
	line(sep)
	for _, r := range rows {
		line(r)
	}
	return b.String()
}

// Code quotes s as inline code, or returns "" for "".
func Code(s string) string {
	if s == "" {
		return ""
	}
	return "`" + s + "`"
}

// Markers returns the begin and end comments of the part name.
func Markers(name string) (begin, end string) {
	return "<!-- " + name + ":begin -->", "<!-- " + name + ":end -->"
}

// Replace returns doc with the part name's content replaced by body (the
// markers stay, each on its own line), and the content it had.
func Replace(doc, name, body string) (out, old string, err error) {
	begin, end := Markers(name)
	i := strings.Index(doc, begin)
	if i < 0 {
		return "", "", fmt.Errorf("no %s marker", begin)
	}
	if strings.Count(doc, begin) > 1 {
		return "", "", fmt.Errorf("%s appears twice", begin)
	}
	start := i + len(begin)
	j := strings.Index(doc[start:], end)
	if j < 0 {
		return "", "", fmt.Errorf("%s without %s after it", begin, end)
	}
	stop := start + j
	if body != "" && !strings.HasSuffix(body, "\n") {
		body += "\n"
	}
	return doc[:start] + "\n" + body + doc[stop:], strings.TrimPrefix(doc[start:stop], "\n"), nil
}

// Check holds the part name of the file at path to body: with update it
// writes body there, otherwise it fails t when the file differs.
func Check(t testing.TB, path, name, body string, update bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out, old, err := Replace(string(b), name, body)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if out == string(b) {
		return
	}
	if update {
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: rewrote %s from the code", path, name)
		return
	}
	t.Errorf("%s: %s differs from the code; run make docs (or this test with -update) and review the diff.\n%s",
		path, name, lineDiff(old, body))
}

// lineDiff lists the lines only the doc has (-) and only the code has (+).
func lineDiff(doc, code string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	d, c := in(doc), in(code)
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !c[l] {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range strings.Split(code, "\n") {
		if !d[l] {
			b.WriteString("+ " + l + "\n")
		}
	}
	if b.Len() == 0 {
		return "(the same lines, in another order)"
	}
	return b.String()
}
