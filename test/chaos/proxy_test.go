package chaos

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// echo is an upstream that echoes lines back.
func echo(t *testing.T) string {
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
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// The faults the scenarios use do what they say, and Heal undoes them.
func TestProxyFaults(t *testing.T) {
	p := NewProxy(t, "echo", echo(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func(timeout time.Duration) (time.Duration, error) {
		start := time.Now()
		_ = c.SetDeadline(start.Add(timeout))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return 0, err
		}
		_, err := r.ReadString('\n')
		return time.Since(start), err
	}
	if _, err := roundTrip(2 * time.Second); err != nil {
		t.Fatalf("round trip through a healthy proxy: %v", err)
	}
	p.Blackhole(Downstream)
	if _, err := roundTrip(200 * time.Millisecond); err == nil {
		t.Fatal("round trip with replies blackholed succeeded, want a timeout")
	}
	p.Heal()
	// Healing a blackhole closes the connections it held (toxiproxy's
	// timeout toxic does); new connections work.
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("read on a healed blackholed connection succeeded, want EOF or reset")
	}
	c.Close()
	if c, err = net.Dial("tcp", p.Addr()); err != nil {
		t.Fatal(err)
	}
	r = bufio.NewReader(c)
	if _, err := roundTrip(2 * time.Second); err != nil {
		t.Fatalf("round trip after Heal: %v", err)
	}
	p.Delay(Upstream, 150*time.Millisecond, 0)
	if d, err := roundTrip(2 * time.Second); err != nil || d < 150*time.Millisecond {
		t.Fatalf("round trip with 150ms delay = %v, %v; want >= 150ms", d, err)
	}
	p.Heal()
	p.Cut()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("read on a cut connection succeeded, want EOF or reset")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("dial after Cut: %v", err)
	}
	c2.Close()
}
