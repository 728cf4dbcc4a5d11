// Command testprune lists the _test.go files of a package directory that
// the named tests do not need, so that scripts/mutations.sh can leave them
// out of a deliberate bug's test binary (go test -overlay maps each to "").
// A deliberate bug recompiles its package and every test file of it; in
// internal/agent the test files are larger than the code, and compiling
// them was about a third of each bug's price.
//
//	testprune DIR TestA [TestB ...]
//
// prints one absolute path per line. A file is kept when it declares
// anything the tests reach: a test function named, TestMain, an init
// function or a blank var, and, from there, every top-level name they
// mention, by name alone (a mention of Foo keeps every Foo: a function, a
// method, a type, a var or a const), every method of a type kept, and
// everything else a kept file declares (a file is compiled whole). By
// name alone is more than the type checker would keep, never less: a
// pruned binary builds whenever the whole one does.
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: testprune DIR TestName [TestName ...]")
		os.Exit(2)
	}
	drop, err := Unneeded(os.Args[1], os.Args[2:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "testprune: %v\n", err)
		os.Exit(1)
	}
	for _, f := range drop {
		fmt.Println(f)
	}
}

// decl is one top-level declaration: the file it is in and the names it
// mentions.
type decl struct {
	file     string
	mentions []string
}

// Unneeded returns the absolute paths of dir's _test.go files that no test
// in tests needs (see the package doc), sorted. A test named that no file
// declares is an error: the pattern would run nothing.
func Unneeded(dir string, tests []string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(abs, "*_test.go"))
	if err != nil {
		return nil, err
	}
	byName := map[string][]decl{}  // a name: every declaration of it
	inFile := map[string][]decl{}  // a file: its declarations
	methods := map[string][]decl{} // a receiver type: its methods
	var roots []decl
	fset := token.NewFileSet()
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				dc := decl{path, mentioned(d)}
				inFile[path] = append(inFile[path], dc)
				if d.Recv != nil && len(d.Recv.List) > 0 {
					methods[receiver(d.Recv.List[0].Type)] = append(methods[receiver(d.Recv.List[0].Type)], dc)
				}
				byName[d.Name.Name] = append(byName[d.Name.Name], dc)
				if d.Recv == nil && (d.Name.Name == "init" || d.Name.Name == "TestMain") {
					roots = append(roots, dc)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					dc := decl{path, mentioned(s)}
					inFile[path] = append(inFile[path], dc)
					for _, n := range specNames(s) {
						byName[n] = append(byName[n], dc)
						if n == "_" {
							roots = append(roots, dc)
						}
					}
				}
			}
		}
	}
	for _, t := range tests {
		if len(byName[t]) == 0 {
			return nil, fmt.Errorf("%s: no test file declares %s", dir, t)
		}
		roots = append(roots, byName[t]...)
	}
	keep := map[string]bool{}
	seen := map[string]bool{}
	queue := roots
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		// A file is compiled whole: whatever else it declares must
		// build too.
		if !keep[d.file] {
			keep[d.file] = true
			queue = append(queue, inFile[d.file]...)
		}
		for _, n := range d.mentions {
			if seen[n] {
				continue
			}
			seen[n] = true
			queue = append(queue, byName[n]...)
			queue = append(queue, methods[n]...)
		}
	}
	var drop []string
	for _, path := range files {
		if !keep[path] {
			drop = append(drop, path)
		}
	}
	sort.Strings(drop)
	return drop, nil
}

// mentioned is every identifier in n, selectors' names included (a
// mention of pkg.Foo or x.Foo keeps a Foo of the test files too).
func mentioned(n ast.Node) []string {
	var names []string
	ast.Inspect(n, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok {
			names = append(names, id.Name)
		}
		return true
	})
	return names
}

// specNames is what a type, var or const spec declares.
func specNames(s ast.Spec) []string {
	switch s := s.(type) {
	case *ast.TypeSpec:
		return []string{s.Name.Name}
	case *ast.ValueSpec:
		var names []string
		for _, n := range s.Names {
			names = append(names, n.Name)
		}
		return names
	}
	return nil
}

// receiver is a method's receiver type name: T for T, *T, T[K] and *T[K].
func receiver(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return strings.TrimSpace(fmt.Sprint(e))
		}
	}
}
