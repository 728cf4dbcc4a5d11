package deploy

import (
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the generated parts of the docs from what the binaries export (make docs)")

// undocumented are the metric name prefixes the docs' tables leave out:
// the Go and process collectors, and Raft's own instrumentation, which
// hashicorp/raft names at run time (docs/operations.md).
var undocumented = []string{"go_", "process_", "promhttp_", "ration_raft_"}

// TestMetricsDocs holds docs/api.md's metrics tables, one per binary, to
// what the binaries serve on /metrics once every decision path has been
// driven (exportedMetrics): name, type, labels and help, as the registries
// describe them. Every metric name in the Go source must be in a table,
// so a metric the collection never shows fails here rather than going
// undocumented. make docs rewrites the tables.
func TestMetricsDocs(t *testing.T) {
	ex := exportedMetrics(t)
	names := make([]string, 0, len(ex))
	for n := range ex {
		names = append(names, n)
	}
	slices.Sort(names)
	documented := map[string]bool{}
	for _, bin := range []string{"gateway-agent", "coordinator"} {
		var rows [][]string
		for _, n := range names {
			f := ex[n]
			if !f.from[bin] || slices.ContainsFunc(undocumented, func(p string) bool { return strings.HasPrefix(n, p) }) {
				continue
			}
			documented[n] = true
			rows = append(rows, []string{"`" + n + "`", strings.ToLower(f.typ.String()), strings.Join(sortedKeys(f.labels), ", "), f.help})
		}
		checkDocPart(t, filepath.Join(repoRoot, "docs", "api.md"), "metrics:"+bin,
			mdTable([]string{"name", "type", "labels", "meaning"}, rows), *update)
	}
	for _, n := range sourceMetricNames(t) {
		if !documented[n] && !slices.ContainsFunc(undocumented, func(p string) bool { return strings.HasPrefix(n, p) }) {
			t.Errorf("%s is named in the code but neither binary exported it in the test: drive it in exportedMetrics so that docs/api.md lists it", n)
		}
	}
}

// sourceMetricNames returns the string literals of the root module's
// non-test Go code that look like a metric name.
func sourceMetricNames(t testing.TB) []string {
	t.Helper()
	lit := regexp.MustCompile(`"(ration_[a-z0-9_]*[a-z0-9])"`)
	seen := map[string]bool{}
	for _, dir := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
				seen[m[1]] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) < 20 {
		t.Fatalf("found %d metric names in the source: the scan is not reading it", len(seen))
	}
	return sortedKeys(seen)
}

// The generated parts of a doc sit between <!-- NAME:begin --> and
// <!-- NAME:end --> (the root module's internal/docgen does the same for
// the flag tables; this module cannot import it).

// mdTable renders a Markdown table, escaping "|" in cells.
func mdTable(header []string, rows [][]string) string {
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("|")
		for _, c := range cells {
			c = strings.Join(strings.Fields(strings.ReplaceAll(c, "|", `\|`)), " ")
			if c == "" {
				b.WriteString(" |")
			} else {
				b.WriteString(" " + c + " |")
			}
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

// checkDocPart holds the part name of the file at path to body: with
// update it writes body there, otherwise it fails t when they differ.
func checkDocPart(t testing.TB, path, name, body string, update bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	begin, end := "<!-- "+name+":begin -->", "<!-- "+name+":end -->"
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i || strings.Count(doc, begin) != 1 {
		t.Fatalf("%s: want one %s followed by %s", path, begin, end)
	}
	start := i + len(begin)
	old := strings.TrimPrefix(doc[start:j], "\n")
	if old == body {
		return
	}
	if update {
		if err := os.WriteFile(path, []byte(doc[:start]+"\n"+body+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: rewrote %s", path, name)
		return
	}
	var diff strings.Builder
	oldLines, newLines := strings.Split(old, "\n"), strings.Split(body, "\n")
	for _, l := range oldLines {
		if !slices.Contains(newLines, l) {
			fmt.Fprintf(&diff, "- %s\n", l)
		}
	}
	for _, l := range newLines {
		if !slices.Contains(oldLines, l) {
			fmt.Fprintf(&diff, "+ %s\n", l)
		}
	}
	t.Errorf("%s: %s differs from what the binaries export; run make docs (or this test with -update) and review the diff.\n%s", path, name, diff.String())
}
