package client_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/doc"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// forbidden are what the client module's importers must not inherit: the
// coordinator's Raft and BoltDB, the chaos suite's toxiproxy, the agent's
// Envoy API. (Prefixes of import paths and module paths.)
var forbidden = []string{
	"github.com/hashicorp/raft",
	"go.etcd.io/bbolt",
	"github.com/boltdb/bolt",
	"github.com/Shopify/toxiproxy",
	"github.com/envoyproxy/go-control-plane",
}

func isForbidden(p string) bool {
	return slices.ContainsFunc(forbidden, func(f string) bool { return p == f || strings.HasPrefix(p, f+"/") || strings.HasPrefix(p, f+"@") })
}

// rootPackage reports a package of the root module (github.com/ration-dev/
// ration), which an importer must not link: only this module and the proto
// module.
func rootPackage(p string) bool {
	const root = "github.com/ration-dev/ration"
	if p != root && !strings.HasPrefix(p, root+"/") {
		return false
	}
	return !strings.HasPrefix(p, root+"/client") && !strings.HasPrefix(p, root+"/proto/")
}

// TestAsAnImporter builds what an importer of this module builds: a module
// of its own that requires this one (this module's replace directive does
// not apply to it, so the test points it at this directory and ../proto
// as a release points it at tags), holding a program that uses client and
// clienttest and, as programs of their own, every example of both
// packages as pkg.go.dev's playground would run it. It checks that:
//
//   - every example is a whole program (go/doc gives it a Play file: it
//     uses nothing from the test files around it) and builds;
//   - go list -deps links neither Raft, BoltDB, toxiproxy nor
//     go-control-plane, nor any package of the root module;
//   - go mod graph holds no Raft, BoltDB, toxiproxy and no root module at
//     all. (go-control-plane is in it, as in any gRPC user's: grpc's own
//     go.mod requires it for xDS, which this module does not build.)
func TestAsAnImporter(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("this test runs the go command: %v", err)
	}
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", fmt.Sprintf(`module example.com/importer

go 1.26.0

require github.com/ration-dev/ration/client v0.1.0

replace github.com/ration-dev/ration/client => %s

replace github.com/ration-dev/ration/proto => %s
`, here, filepath.Join(filepath.Dir(here), "proto")))
	sum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	write("go.sum", string(sum))
	write("main.go", `package main

import (
	"context"
	"fmt"

	"github.com/ration-dev/ration/client"
	"github.com/ration-dev/ration/client/clienttest"
)

func main() {
	c, err := client.New("127.0.0.1:8081", client.Options{})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	var a client.Allower = c
	if len(fmt.Sprint(a)) < 0 {
		a = c.AllowStream(context.Background())
	}
	_, _ = clienttest.New(nil).Allow(context.Background(), client.Request{})
}
`)

	examples := 0
	for _, pkg := range []string{".", "clienttest"} {
		fset := token.NewFileSet()
		paths, err := filepath.Glob(filepath.Join(pkg, "*_test.go"))
		if err != nil {
			t.Fatal(err)
		}
		var files []*ast.File
		for _, p := range paths {
			f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		for _, ex := range doc.Examples(files...) {
			name := "Example" + ex.Name
			if ex.Play == nil {
				t.Errorf("%s %s: not a whole program (it uses something declared outside it in the test files): pkg.go.dev cannot run it", pkg, name)
				continue
			}
			var buf bytes.Buffer
			if err := format.Node(&buf, fset, ex.Play); err != nil {
				t.Fatal(err)
			}
			write(filepath.Join("examples", map[string]string{".": "client", "clienttest": "clienttest"}[pkg]+"_"+name, "main.go"), buf.String())
			examples++
		}
	}
	if examples < 8 {
		t.Errorf("found %d examples, want the 8 or more the two packages have", examples)
	}

	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(gobin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return string(out)
	}
	run("mod", "tidy")
	run("build", "./...")

	deps := strings.Fields(run("list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./..."))
	if !slices.Contains(deps, "github.com/ration-dev/ration/proto/ration/v1") || !slices.Contains(deps, "google.golang.org/grpc") {
		t.Fatalf("go list -deps shows no proto or grpc: the check is broken\n%s", strings.Join(deps, "\n"))
	}
	for _, p := range deps {
		if isForbidden(p) || rootPackage(p) {
			t.Errorf("an importer links %s", p)
		}
	}
	t.Logf("an importer links %d packages outside the standard library", len(deps))

	for _, edge := range strings.Split(strings.TrimSpace(run("mod", "graph")), "\n") {
		from, to, _ := strings.Cut(edge, " ")
		mod, _, _ := strings.Cut(to, "@")
		switch {
		case mod == "github.com/ration-dev/ration":
			t.Errorf("an importer's module graph holds the root module: %s", edge)
		case isForbidden(mod) && !strings.HasPrefix(mod, "github.com/envoyproxy/go-control-plane"):
			t.Errorf("an importer's module graph holds %s", edge)
		case strings.HasPrefix(mod, "github.com/envoyproxy/go-control-plane") && strings.HasPrefix(from, "github.com/ration-dev/"):
			t.Errorf("a Ration module requires go-control-plane: %s", edge)
		}
	}
}
