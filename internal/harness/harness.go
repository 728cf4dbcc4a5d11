package harness

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// RequiresProcesses skips t under -short: `make check` is the tier that
// runs without redis-server, Raft groups or other processes (every test
// that needs them reaches this through the harness), in under two
// minutes; `make test` never passes -short, and runs them all.
func RequiresProcesses(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short (make check): this test runs real processes or a Raft group; make test runs it")
	}
}

// RequireBinary returns the path of the executable name, or fails the test
// saying which Debian package provides it. Tests never skip for a missing
// binary: `make test` installs what they need (under -short, make check's
// tier, a test that needs one is skipped: RequiresProcesses).
func RequireBinary(t testing.TB, name, debianPkg string) string {
	t.Helper()
	RequiresProcesses(t)
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found: install it with apt-get install %s (make test does this)", name, debianPkg)
	}
	return path
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, for
// a process that binds it later.
//
// The port comes from below the kernel's ephemeral range, never from
// `:0`: the kernel hands out ephemeral ports to every outgoing connection
// (each gRPC, Redis and Raft client of a test), so a port it gave to
// FreePort, released and not yet bound by the process it was meant for,
// could become some client's local port in between: a coordinator then
// failed to start with "address already in use". Below that range only
// other FreePort callers pick ports; each test process walks the range
// from a random place, and a port is handed out once per process.
func FreePort(t testing.TB) int {
	t.Helper()
	ports.once.Do(ports.init)
	ports.mu.Lock()
	defer ports.mu.Unlock()
	for range ports.hi - ports.lo {
		p := ports.lo + ports.next
		ports.next = (ports.next + 1) % (ports.hi - ports.lo)
		if free(p) {
			return p
		}
	}
	t.Fatalf("harness: no free port in %d-%d on 127.0.0.1", ports.lo, ports.hi-1)
	return 0
}

// portRange is FreePort's state, one per test process.
type portRange struct {
	once   sync.Once
	mu     sync.Mutex
	lo, hi int // [lo, hi): below the ephemeral range
	next   int // offset of the next candidate
}

var ports portRange

func (p *portRange) init() {
	p.lo, p.hi = 10000, ephemeralLow()
	if p.hi-p.lo < 1000 { // an unusual ephemeral range: take what is left
		p.lo, p.hi = 1024, max(p.hi, 2048)
	}
	p.next = rand.IntN(p.hi - p.lo)
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// default, 32768, when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if lo, err := strconv.Atoi(f[0]); err == nil && lo > 1024 {
				return lo
			}
		}
	}
	return 32768
}

// free reports whether port can be bound on 127.0.0.1 now.
func free(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
