package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// binDir holds gateway-agent and coordinator, built once per test binary.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "ration-chaos-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	defer os.RemoveAll(dir)
	for _, cmd := range []string{"gateway-agent", "coordinator"} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, cmd), "github.com/ration-dev/ration/cmd/"+cmd).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: go build %s: %v\n%s", cmd, err, out)
			return 2
		}
	}
	binDir = dir
	code := m.Run()
	if err := writeReport(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
