package harness

import (
	"bufio"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// echoConn is one client connection through a proxy, line by line.
type echoConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialEcho(t *testing.T, p *Proxy) *echoConn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &echoConn{t: t, c: c, r: bufio.NewReader(c)}
}

// roundTrip sends a line and reads it back within timeout.
func (e *echoConn) roundTrip(line string, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	_ = e.c.SetDeadline(start.Add(timeout))
	if _, err := e.c.Write([]byte(line + "\n")); err != nil {
		return 0, err
	}
	got, err := e.r.ReadString('\n')
	if err == nil && got != line+"\n" {
		e.t.Fatalf("echo of %q came back as %q", line, got)
	}
	return time.Since(start), err
}

// read waits up to timeout for a line the proxy held.
func (e *echoConn) read(timeout time.Duration) (string, error) {
	_ = e.c.SetDeadline(time.Now().Add(timeout))
	return e.r.ReadString('\n')
}

func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// A blackhole drops bytes and closes nothing; Heal lifts it and closes the
// connections whose bytes it dropped; Delay holds each chunk; Reset
// closes with a TCP reset and new connections work.
func TestProxyFaults(t *testing.T) {
	p := NewProxy(t, Echo(t))
	c := dialEcho(t, p)
	if _, err := c.roundTrip("ping", 2*time.Second); err != nil {
		t.Fatalf("round trip through a healthy proxy: %v", err)
	}
	p.Blackhole(Downstream)
	if _, err := c.roundTrip("lost", 200*time.Millisecond); !timedOut(err) {
		t.Fatalf("round trip with replies blackholed: %v, want a timeout", err)
	}
	p.Heal()
	if _, err := c.read(2 * time.Second); err == nil || timedOut(err) {
		t.Fatalf("read on a healed blackholed connection: %v, want EOF or reset", err)
	}
	c = dialEcho(t, p)
	if _, err := c.roundTrip("healed", 2*time.Second); err != nil {
		t.Fatalf("round trip after Heal: %v", err)
	}
	p.Delay(Upstream, 150*time.Millisecond, 0)
	if d, err := c.roundTrip("slow", 2*time.Second); err != nil || d < 150*time.Millisecond {
		t.Fatalf("round trip with 150ms delay = %v, %v; want >= 150ms", d, err)
	}
	p.Heal()
	p.Reset()
	_, err := c.read(2 * time.Second)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read on a reset connection: %v, want a connection reset", err)
	}
	c = dialEcho(t, p)
	if _, err := c.roundTrip("after reset", 2*time.Second); err != nil {
		t.Fatalf("round trip after Reset: %v", err)
	}
}

// A stall holds bytes without losing or closing anything: what was sent
// during it arrives, in order, once it ends.
func TestProxyStallHoldsBytes(t *testing.T) {
	p := NewProxy(t, Echo(t))
	c := dialEcho(t, p)
	if _, err := c.roundTrip("before", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	for _, l := range []string{"one", "two"} {
		if _, err := c.c.Write([]byte(l + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := c.read(200 * time.Millisecond); !timedOut(err) {
		t.Fatalf("read during a stall: %q, %v; want a timeout", got, err)
	}
	p.Resume()
	for _, want := range []string{"one\n", "two\n"} {
		if got, err := c.read(2 * time.Second); err != nil || got != want {
			t.Fatalf("after the stall: %q, %v; want %q", got, err, want)
		}
	}
}

// SetRate paces one direction of each connection: 4 KiB at 16 KiB/s takes
// about a quarter of a second, at full speed much less.
func TestProxyRate(t *testing.T) {
	p := NewProxy(t, Echo(t))
	c := dialEcho(t, p)
	big := make([]byte, 4095)
	for i := range big {
		big[i] = 'x'
	}
	p.SetRate(Upstream, 16<<10)
	d, err := c.roundTrip(string(big), 5*time.Second)
	if err != nil || d < 200*time.Millisecond {
		t.Fatalf("4 KiB at 16 KiB/s: %v, %v; want at least 200ms", d, err)
	}
	p.SetRate(Upstream, 0)
	if _, err := c.roundTrip(string(big), 5*time.Second); err != nil {
		t.Fatalf("at full speed again: %v", err)
	}
}

// Retarget closes the connections to the old upstream and sends new ones
// to the new one.
func TestProxyRetarget(t *testing.T) {
	first := Echo(t)
	p := NewProxy(t, first)
	c := dialEcho(t, p)
	if _, err := c.roundTrip("first", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	// The second upstream answers with its own greeting, so the test knows
	// which one it reached.
	second := ServeTCP(t, func(s net.Conn) { _, _ = s.Write([]byte("second\n")); s.Close() })
	p.Retarget(second)
	if _, err := c.read(2 * time.Second); err == nil || timedOut(err) {
		t.Fatalf("read on a connection to the old upstream: %v, want it closed", err)
	}
	c = dialEcho(t, p)
	if got, err := c.read(2 * time.Second); err != nil || got != "second\n" {
		t.Fatalf("new connection after Retarget: %q, %v; want the new upstream's greeting", got, err)
	}
}
