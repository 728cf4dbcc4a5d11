package harness

import (
	"net"
	"strconv"
	"testing"
)

// FreePort's ports lie below the kernel's ephemeral range (where no client
// connection can take one before its process binds it), are handed out
// once per process, and can be bound.
func TestFreePortBelowEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	seen := map[int]bool{}
	for range 300 {
		p := FreePort(t)
		if p >= low || p < 1024 {
			t.Fatalf("FreePort = %d, want a port in [1024, %d)", p, low)
		}
		if seen[p] {
			t.Fatalf("FreePort handed out %d twice", p)
		}
		seen[p] = true
	}
	for p := range seen {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d from FreePort cannot be bound: %v", p, err)
		}
		l.Close()
		break
	}
}
