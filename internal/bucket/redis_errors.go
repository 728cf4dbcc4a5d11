package bucket

// How the store reads go-redis errors: which are NOSCRIPT, which mean the
// server is unavailable, which refuse credentials.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// noRetryCmd keeps go-redis from sending a command again after a network
// error: the first attempt may have run.
type noRetryCmd struct{ *redis.StringCmd }

func (noRetryCmd) NoRetry() bool { return true }

func isNoScript(err error) bool { return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") }

func (s *RedisStore) noteReload() {
	now := time.Now().UnixNano()
	last := s.lastReload.Load()
	if now-last > int64(time.Minute) && s.lastReload.CompareAndSwap(last, now) {
		s.log.Info("redis answered NOSCRIPT (restart, failover or SCRIPT FLUSH); reloading the bucket script with EVAL")
	}
}

// fail wraps a Redis error with the operation, and with ErrUnavailable when
// the store could not be reached or could not apply the decision now.
func (s *RedisStore) fail(op string, err error) error {
	if authFailed(err) {
		return fmt.Errorf("bucket: redis %s: %w: %w", op, ErrAuth, err)
	}
	if unavailable(err) {
		return fmt.Errorf("bucket: redis %s: %w: %w", op, ErrUnavailable, err)
	}
	return fmt.Errorf("bucket: redis %s: %w", op, err)
}

// authFailed reports whether err is Redis refusing the credentials, on the
// AUTH or HELLO of a new connection or on a command sent without them.
// Versions before 6 answer "ERR invalid password"; later ones WRONGPASS,
// or "ERR AUTH ... called without any password configured" when the
// server requires none.
func authFailed(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	for _, p := range []string{"WRONGPASS", "NOAUTH", "ERR invalid password", "ERR AUTH ", "ERR invalid username-password pair"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// unavailableCodes are server replies meaning "not now, not here": the
// command was refused (or could not be confirmed), and another node or a
// later moment may answer.
var unavailableCodes = []string{
	"LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN",
	"NOREPLICAS", "OOM", "BUSY", "MISCONF",
}

// unavailable reports whether err means the store could not be reached or
// answer in time: network errors, deadlines, pool exhaustion, a closed
// client, and the server replies in unavailableCodes.
func unavailable(err error) bool {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		if strings.HasPrefix(msg, "ERR max number of clients reached") {
			return true
		}
		for _, code := range unavailableCodes {
			// Redis 7 keeps the code first in a script's error; older
			// versions quote it as "-CODE" inside "ERR Error running script".
			if strings.HasPrefix(msg, code+" ") || strings.Contains(msg, "-"+code+" ") {
				return true
			}
		}
		return false
	}
	var nerr net.Error
	return errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled) ||
		errors.Is(err, redis.ErrPoolTimeout) ||
		errors.Is(err, redis.ErrPoolExhausted) ||
		errors.Is(err, redis.ErrClosed) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) ||
		errors.As(err, &nerr)
}
