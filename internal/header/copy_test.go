package header

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// The client module (client/, a module of its own) cannot import this
// package, so client/internal/header holds a copy of it: the Go
// middleware must write what the agent writes. The copy is byte for byte
// (doc.go aside); after changing a file here, copy it there.
func TestClientCopy(t *testing.T) {
	for _, name := range []string{"header.go", "list.go"} {
		ours, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		copyPath := filepath.Join("..", "..", "client", "internal", "header", name)
		theirs, err := os.ReadFile(copyPath)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(ours, theirs) {
			t.Errorf("%s differs from internal/header/%s: cp internal/header/%s %s", copyPath, name, name, copyPath)
		}
	}
}
