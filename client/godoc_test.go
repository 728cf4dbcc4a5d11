package client_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestGoDocsBeforeARelease runs docs/integrations/go.md's ways to use this
// module before a version is published (a workspace, replace directives):
// each fence its doccmd marker names this test, as written but for the
// RATION= line, set to this checkout, in a directory holding myservice, a
// module of its own whose program imports client. The go command works
// from the module cache only (GOPROXY=off): what the fence resolves must
// come from the checkout, not from a published version.
func TestGoDocsBeforeARelease(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	for _, bin := range []string{"go", "bash"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("this test runs %s: %v", bin, err)
		}
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "integrations", "go.md"))
	if err != nil {
		t.Fatal(err)
	}
	fences := regexp.MustCompile("(?s)<!-- doccmd: skip: run by TestGoDocsBeforeARelease [^>]*-->\n```sh\n(.*?)```").FindAllStringSubmatch(string(doc), -1)
	if len(fences) != 2 {
		t.Fatalf("docs/integrations/go.md: %d fences marked for this test, want 2 (the workspace and the replace directives)", len(fences))
	}
	// The fences resolve from the module cache alone: fill it with every
	// module of the client's graph (tests of dependencies included, which
	// go mod tidy reads), as a developer's cache is after building the
	// checkout. Without this the test passed only after some other go
	// command had filled the cache.
	// go mod download adds to go.sum what it downloads: it works on a copy
	// (-modfile), so that the checkout's go.sum stays as committed.
	mod := filepath.Join(t.TempDir(), "go.mod")
	for _, name := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(root, "client", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(filepath.Dir(mod), name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dl := exec.Command("go", "mod", "download", "-modfile="+mod, "all")
	dl.Dir = filepath.Join(root, "client")
	dl.Env = append(os.Environ(), "GOWORK=", "GOFLAGS=")
	if out, err := dl.CombinedOutput(); err != nil {
		t.Fatalf("go mod download all (client): %v\n%s", err, out)
	}
	ratLine := regexp.MustCompile(`(?m)^RATION=\S+`)
	for i, f := range fences {
		script := f[1]
		if !ratLine.MatchString(script) {
			t.Fatalf("fence %d sets no RATION=:\n%s", i, script)
		}
		script = ratLine.ReplaceAllLiteralString(script, "RATION="+root)
		dir := t.TempDir()
		svc := filepath.Join(dir, "myservice")
		if err := os.MkdirAll(svc, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, content := range map[string]string{
			"go.mod": "module example.com/myservice\n\ngo 1.26.0\n",
			"main.go": `package main

import (
	"fmt"

	"github.com/ration-dev/ration/client"
	"github.com/ration-dev/ration/client/header"
)

func main() {
	c, err := client.New("127.0.0.1:8081", client.Options{})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	fmt.Println(header.RetryAfter(0))
}
`,
		} {
			if err := os.WriteFile(filepath.Join(svc, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOPROXY=off", "GOSUMDB=off", "GOWORK=", "GOFLAGS=")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("fence %d of docs/integrations/go.md:\n%s\nfailed: %v\n%s", i, script, err, out)
		}
		// The build must have taken the checkout's client.
		list := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/ration-dev/ration/client")
		list.Dir = svc
		list.Env = cmd.Env
		b, err := list.CombinedOutput()
		if err != nil || strings.TrimSpace(string(b)) != root+string(filepath.Separator)+"client" {
			t.Errorf("fence %d: myservice resolves the client module at %q (%v), want %s/client", i, strings.TrimSpace(string(b)), err, root)
		}
	}
}
