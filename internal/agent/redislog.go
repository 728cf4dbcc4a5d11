package agent

import (
	"context"
	"fmt"
	"log/slog"
)

// RedisLogger adapts slog to go-redis's process-wide logger, at debug level:
// go-redis logs every failed dial, and the agent already logs the state
// changes that matter (breaker open/closed, outage episodes) once each.
// Install it from main with redis.SetLogger, once per process.
type RedisLogger struct{ Logger *slog.Logger }

// Printf implements go-redis's internal Logging interface.
func (l RedisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.Logger.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}
