package tlsfiles

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
)

// HandshakeLog logs the failed TLS handshakes of one listener, at most one
// line per interval: a client of another CA, without a certificate, or of
// a role the listener refuses fails at every connection, and fifty of them
// must not be fifty lines. The first failure of an interval is logged in
// full, with how many were held back since the line before; every failure
// is counted (Failures).
type HandshakeLog struct {
	logger   *slog.Logger
	listener string
	every    time.Duration

	mu       sync.Mutex
	last     time.Time
	held     int
	failures atomic.Int64
}

// NewHandshakeLog returns the log of listener (a flag name: "-grpc"),
// writing to logger at most once per every.
func NewHandshakeLog(logger *slog.Logger, listener string, every time.Duration) *HandshakeLog {
	return &HandshakeLog{logger: logger, listener: listener, every: every}
}

// Failed records a failed handshake from remote. A connection closed
// before its handshake began (io.EOF: a TCP probe, a port scan) is
// counted, not logged.
func (h *HandshakeLog) Failed(remote net.Addr, err error) {
	h.failures.Add(1)
	if errors.Is(err, io.EOF) {
		return
	}
	now := time.Now()
	h.mu.Lock()
	if !h.last.IsZero() && now.Sub(h.last) < h.every {
		h.held++
		h.mu.Unlock()
		return
	}
	held := h.held
	h.last, h.held = now, 0
	h.mu.Unlock()
	addr := ""
	if remote != nil {
		addr = remote.String()
	}
	h.logger.Warn("TLS handshake failed; connection closed", "listener", h.listener, "remote", addr, "err", err,
		"held_back_before", held, "at_most_one_per", h.every)
}

// Failures counts the failed handshakes recorded.
func (h *HandshakeLog) Failures() int64 { return h.failures.Load() }

// Credentials wraps gRPC server credentials so that their failed
// handshakes are recorded here (gRPC itself logs them only at its info
// level, to its own logger, which the processes leave discarded).
func (h *HandshakeLog) Credentials(c credentials.TransportCredentials) credentials.TransportCredentials {
	return loggedCreds{TransportCredentials: c, log: h}
}

type loggedCreds struct {
	credentials.TransportCredentials
	log *HandshakeLog
}

func (c loggedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		c.log.Failed(raw.RemoteAddr(), err)
	}
	return conn, info, err
}

func (c loggedCreds) Clone() credentials.TransportCredentials {
	return loggedCreds{TransportCredentials: c.TransportCredentials.Clone(), log: c.log}
}
