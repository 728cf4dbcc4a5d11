package bucket

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultWarmTimeout is RedisOptions.WarmTimeout's default: a TLS
// handshake and a script load over a slow link, not a decision.
const DefaultWarmTimeout = time.Second

// WarmConns is how many pooled connections Warm opens: enough that the
// first decisions after start do not queue behind one another's dials
// (each one a TCP, and with rediss:// a TLS, handshake).
const WarmConns = 4

// Warm makes the store ready to decide at full speed: it loads the bucket
// and hot-key scripts on every primary (SCRIPT LOAD; a Redis that was just
// started, failed over or flushed holds none, and the first EVALSHA would
// answer NOSCRIPT and send the script again) and opens conns pooled
// connections, handshakes done. ctx bounds it; callers give it more than a
// decision's time (DefaultWarmTimeout).
func (s *RedisStore) Warm(ctx context.Context, conns int) error {
	if err := s.loadScripts(ctx); err != nil {
		return s.fail("script load", err)
	}
	var wg sync.WaitGroup
	errs := make([]error, max(conns, 0))
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Concurrent PINGs each hold a connection of their own, so the
			// pool ends with conns of them open (not one, reused).
			errs[i] = s.c.Ping(ctx).Err()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return s.fail("warm", err)
	}
	return nil
}

// loadScripts runs SCRIPT LOAD of both scripts on every primary.
func (s *RedisStore) loadScripts(ctx context.Context) error {
	load := func(ctx context.Context, c redis.Cmdable) error {
		for _, src := range []string{scriptSrc, hotSrc} {
			if err := c.ScriptLoad(ctx, src).Err(); err != nil {
				return fmt.Errorf("SCRIPT LOAD: %w", err)
			}
		}
		return nil
	}
	if cc, ok := s.c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) })
	}
	return load(ctx, s.c)
}

// rewarm is the context of the calls that follow a NOSCRIPT answer: the
// server lost the scripts (a restart, a failover to a replica that never
// ran them, SCRIPT FLUSH), so the connections were likely just made again
// too. Those calls (EVAL with the script's source, perhaps on a fresh TLS
// connection) are warm-up, not decisions: bounded by the store's
// WarmTimeout instead of the caller's deadline, so that the first
// decision after a topology change is made by Redis, a little late,
// rather than counted as a store failure. Its cancel must be called.
func (s *RedisStore) rewarm(ctx context.Context) (context.Context, context.CancelFunc) {
	s.noteReload()
	s.rewarms.Add(1)
	return context.WithTimeout(context.WithoutCancel(ctx), s.warmTimeout)
}

// Rewarms counts the calls that found the scripts gone (NOSCRIPT) and
// were given the warm-up budget.
func (s *RedisStore) Rewarms() int64 { return s.rewarms.Load() }
