package docgen

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// A package doc with a "Files:" paragraph is a map of the package for a
// newcomer: it names every file of the package (tests and doc.go aside),
// and names no file that is gone. The packages listed must keep one.
var mapped = []string{
	"internal/holder",
	"internal/lease",
	"internal/rlqs",
	"internal/rules",
	"internal/bucket",
	"internal/admission",
	"internal/tlsfiles",
}

var goFile = regexp.MustCompile(`\b[A-Za-z0-9_]+\.go\b`)

func TestPackageFileMaps(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(root, path)
		files, doc := packageDoc(t, path)
		if len(files) == 0 {
			return nil
		}
		_, fm, ok := strings.Cut(doc, "Files:")
		if !ok {
			if slices.Contains(mapped, rel) {
				t.Errorf("%s: its package doc has no Files: paragraph (a map of its files)", rel)
			}
			return nil
		}
		seen++
		fm, _, _ = strings.Cut(fm, "\n\n")
		named := map[string]bool{}
		for _, f := range goFile.FindAllString(fm, -1) {
			named[f] = true
		}
		for _, f := range files {
			if !named[f] && f != "doc.go" {
				t.Errorf("%s: the package doc's Files: paragraph does not name %s", rel, f)
			}
			delete(named, f)
		}
		for f := range named {
			t.Errorf("%s: the package doc's Files: paragraph names %s, which is not a file of the package", rel, f)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < len(mapped) {
		t.Errorf("%d file maps checked, want at least the %d listed", seen, len(mapped))
	}
}

// packageDoc is dir's non-test Go files and its package doc comment.
func packageDoc(t *testing.T, dir string) (files []string, doc string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		files = append(files, n)
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if f.Doc != nil {
			doc += f.Doc.Text()
		}
	}
	return files, doc
}
