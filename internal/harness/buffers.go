package harness

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
)

// LogBuffer is a log destination (or a process's output) that a test
// reads while a logger or a process writes it.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// ServeTCP accepts connections on a loopback port of its own until the
// test ends, handing each to handle on a goroutine of its own (handle
// closes it), and returns the address.
func ServeTCP(t testing.TB, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return ln.Addr().String()
}

// Echo is an upstream that echoes what it reads, until the test ends.
func Echo(t testing.TB) string {
	t.Helper()
	return ServeTCP(t, func(c net.Conn) { defer c.Close(); _, _ = io.Copy(c, c) })
}
