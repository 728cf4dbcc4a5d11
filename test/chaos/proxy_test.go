package chaos

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
)

func TestSenderOf(t *testing.T) {
	ids := []string{"node0", "node1", "node2"}
	for _, tt := range []struct{ in, want string }{
		{"\x00\x81\xa2IDnode2\xa4Addr...node0...node1", "node2"},
		{"xx node1 node0", "node1"},
		{"nothing", ""},
	} {
		if got := senderOf([]byte(tt.in), ids); got != tt.want {
			t.Errorf("senderOf(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// A link proxy cuts the isolated sender's connections and passes others.
func TestLinkProxyIsolate(t *testing.T) {
	up := harness.Echo(t)
	ps := NewLinkProxies(t, []string{"node0", "node1"}, []string{up, up})
	dial := func(hello string) (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", ps[1].Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_, _ = c.Write([]byte(hello + "\n"))
		r := bufio.NewReader(c)
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatalf("first round trip from %s: %v", hello, err)
		}
		return c, r
	}
	c0, r0 := dial("node0")
	c2, r2 := dial("node2")
	ps[0].Isolate("node0")
	_ = c0.SetDeadline(time.Now().Add(200 * time.Millisecond))
	_, _ = c0.Write([]byte("again\n"))
	if _, err := r0.ReadString('\n'); err == nil {
		t.Fatal("the isolated sender's link still carries data")
	}
	_ = c2.SetDeadline(time.Now().Add(2 * time.Second))
	_, _ = c2.Write([]byte("again\n"))
	if _, err := r2.ReadString('\n'); err != nil {
		t.Fatalf("another sender's link was cut too: %v", err)
	}
	for _, p := range ps {
		p.Heal()
	}
}
