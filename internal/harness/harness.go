package harness

import (
	"net"
	"os/exec"
	"testing"
)

// RequireBinary returns the path of the executable name, or fails the test
// saying which Debian package provides it. Tests never skip for a missing
// binary: `make test` installs what they need.
func RequireBinary(t testing.TB, name, debianPkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found: install it with apt-get install %s (make test does this)", name, debianPkg)
	}
	return path
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
// Another process may take it before the caller binds it: starters retry.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("harness: find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
