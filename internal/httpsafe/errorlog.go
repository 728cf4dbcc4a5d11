package httpsafe

import (
	"log"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// ErrorLog is an http.Server's ErrorLog for logger: what net/http reports
// of its connections (TLS handshakes that fail, a query with a ';', a
// malformed request line) is written as structured records at Warn, at
// most one per interval, each saying how many were suppressed before it.
// Without it net/http writes every one to the standard logger, unstructured,
// so that any client that can connect can flood the log.
func ErrorLog(logger *slog.Logger, interval time.Duration) *log.Logger {
	return log.New(&limited{logger: logger, every: interval}, "", 0)
}

type limited struct {
	logger *slog.Logger
	every  time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (l *limited) Write(p []byte) (int, error) {
	now := time.Now()
	l.mu.Lock()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.suppressed++
		l.mu.Unlock()
		return len(p), nil
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	l.mu.Unlock()
	l.logger.Warn("http server: "+strings.TrimSpace(string(p)), "suppressed_before", n, "at_most_one_per", l.every)
	return len(p), nil
}
