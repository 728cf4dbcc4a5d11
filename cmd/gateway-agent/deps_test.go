package main

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const coordinatorPkg = "github.com/ration-dev/ration/internal/coordinator"

// raftPkgs are the roots of what running a coordinator links: Raft and its
// BoltDB log store.
var raftPkgs = []string{"github.com/hashicorp/raft", "github.com/hashicorp/raft-boltdb", "go.etcd.io/bbolt", "github.com/boltdb/bolt"}

func isRaft(pkg string) bool {
	return slices.ContainsFunc(raftPkgs, func(p string) bool { return pkg == p || strings.HasPrefix(pkg, p+"/") })
}

// goList runs go list -deps with format over pkgs and returns its lines.
func goList(t *testing.T, format string, pkgs ...string) []string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go list needs the go command: %v", err)
	}
	args := append([]string{"list", "-deps", "-f", format}, pkgs...)
	out, err := exec.Command(gobin, args...).Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, msg)
	}
	return strings.Fields(string(out)) // one package a line, no spaces in the formats used

}

// The agent links no Raft and no BoltDB: internal/agent reaches
// coordinators through internal/coordclient, and the one import of
// internal/coordinator in the binary is the -dev wiring (dev.go), the only
// way Raft gets in.
func TestDevWiringAloneImportsTheCoordinator(t *testing.T) {
	for _, p := range goList(t, "{{.ImportPath}}", "github.com/ration-dev/ration/internal/agent") {
		if isRaft(p) || p == coordinatorPkg {
			t.Errorf("go list -deps ./internal/agent has %s: the agent must reach coordinators through internal/coordclient only", p)
		}
	}

	// Over the binary: who imports the coordinator, and who imports Raft.
	out := goList(t, "{{.ImportPath}}:{{range .Imports}}{{.}},{{end}}", ".")
	sawRaft := false
	for _, line := range out {
		pkg, imports, _ := strings.Cut(line, ":")
		for _, imp := range strings.Split(strings.TrimSuffix(imports, ","), ",") {
			switch {
			case imp == coordinatorPkg && pkg != "github.com/ration-dev/ration/cmd/gateway-agent":
				t.Errorf("%s imports %s: only cmd/gateway-agent's -dev wiring may", pkg, coordinatorPkg)
			case isRaft(imp) && !isRaft(pkg):
				sawRaft = true
				if pkg != coordinatorPkg {
					t.Errorf("%s imports %s: Raft and BoltDB must come in through %s only", pkg, imp, coordinatorPkg)
				}
			}
		}
	}
	if !sawRaft {
		t.Error("go list -deps . shows no import of Raft at all: the -dev embedded coordinator is gone, or the check is broken")
	}

	// Within the command, dev.go alone.
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if path, _ := strconv.Unquote(imp.Path.Value); path == coordinatorPkg && name != "dev.go" {
				t.Errorf("%s imports %s: keep the -dev wiring in dev.go", name, coordinatorPkg)
			}
		}
	}
}
