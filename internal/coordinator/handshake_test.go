package coordinator_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/coordinator"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/tlsfiles"
)

// TestHandshakeFailuresLogOnce: fifty clients of another CA knock on each
// TLS port of a node (lease, admin, Raft). Every failed handshake is
// counted, and each port logs one structured line for them (not fifty),
// naming the listener; the Raft transport does not log each as an error.
func TestHandshakeFailuresLogOnce(t *testing.T) {
	pki := harness.NewPKI(t)
	cfg := harness.RaftTestConfig()
	cfg.ID, cfg.Bootstrap, cfg.DataDir = "n1", true, t.TempDir()
	cfg.Rules, cfg.Insecure = mustRules(t, testRules), false
	cfg.TLS = pki.Member(tlsfiles.GlobalGroup, "n1")
	var log harness.LogBuffer
	n, err := coordinator.Start(context.Background(), cfg, slog.New(slog.NewTextHandler(&log, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	other := harness.NewPKI(t)
	stranger := other.Source(other.Agent("x"))
	const knocks = 50
	for _, port := range []struct{ listener, addr string }{
		{"-grpc", n.GRPCAddr()}, {"-admin", n.AdminAddr()}, {"-raft", n.RaftAddr()},
	} {
		start := time.Now()
		for range knocks {
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", port.addr, stranger.ClientConfig("127.0.0.1", nil))
			if err == nil {
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				c.Read(make([]byte, 1)) // until the server gives up on it
				c.Close()
			}
		}
		for n.HandshakeFailures(port.listener) < knocks {
			time.Sleep(10 * time.Millisecond)
		}
		// One line per minute: on a machine so loaded that the knocks
		// outlast a minute, one more line for each minute they took.
		want := 1 + int(time.Since(start)/time.Minute)
		if got := strings.Count(log.String(), "listener="+port.listener+" "); got < 1 || got > want {
			t.Errorf("%s: %d lines for %d failed handshakes, want 1 (at most %d after %v):\n%s", port.listener, got, knocks, want, time.Since(start), log.String())
		}
	}
	if strings.Contains(log.String(), "failed to decode incoming command") {
		t.Errorf("the Raft transport logged the failed handshakes itself:\n%s", log.String())
	}
}
