package bucket

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
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
	// And one through the path decisions take (the automatic pipeliner,
	// whose connections are its own).
	if err := s.do(ctx, redis.NewStatusCmd(ctx, "ping")); err != nil {
		return s.fail("warm", err)
	}
	if cc, ok := s.c.(*redis.ClusterClient); ok && s.nodeAP {
		// A Cluster's decisions go through each master's pipeliner
		// (doNode): each gets its connection now, or the first decisions
		// of every master would wait for a dial.
		err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			nc, err := s.nodeConn(n)
			if err != nil {
				return err
			}
			if err := nc.ap.Submit(ctx, redis.NewStatusCmd(ctx, "ping")).WaitContext(ctx); err != nil {
				return err
			}
			// Warm: no decision on it need wait for a warm-up of its own.
			s.endWarm(nc)
			return nil
		})
		if err != nil {
			return s.fail("warm", err)
		}
	}
	return nil
}

// loadScripts runs SCRIPT LOAD of both scripts on every primary, each
// through a client of its own with the warm-up timeout on its sockets: the
// store's client bounds every read and write by the decision timeout
// (go-redis takes the earlier of that and the context's deadline), too
// short to send 15 kB of scripts over a slow or just-failed-over link.
func (s *RedisStore) loadScripts(ctx context.Context) error {
	switch c := s.c.(type) {
	case *redis.Client: // a single server, or a Sentinel-managed primary
		return s.loadScriptsOn(ctx, c.Options())
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return s.loadScriptsOn(ctx, n.Options()) })
	default:
		return loadScriptsWith(ctx, s.c)
	}
}

// loadScriptsOn loads both scripts on the server of o through a client of
// its own, patient as loadScripts says.
func (s *RedisStore) loadScriptsOn(ctx context.Context, o *redis.Options) error {
	po := *o
	// A config of its own: go-redis writes the node client's (its
	// maintenance-notifications mode) while it makes a connection, which
	// a warm-up running beside decisions must not read. A one-off client
	// needs no maintenance notifications.
	po.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	po.PushNotificationProcessor = nil
	po.ReadTimeout, po.WriteTimeout, po.DialTimeout = s.warmTimeout, s.warmTimeout, s.warmTimeout
	po.PoolSize, po.MinIdleConns, po.MaxIdleConns = 1, 0, 0
	c := redis.NewClient(&po)
	defer c.Close()
	return loadScriptsWith(ctx, c)
}

func loadScriptsWith(ctx context.Context, c redis.Cmdable) error {
	for _, src := range []string{scriptSrc, hotSrc} {
		if err := c.ScriptLoad(ctx, src).Err(); err != nil {
			return fmt.Errorf("SCRIPT LOAD: %w", err)
		}
	}
	return nil
}

// rewarm runs after a call found the scripts gone (NOSCRIPT): the server
// lost them (a restart, a failover to a replica that never ran them,
// SCRIPT FLUSH), and its connections were likely just made again too.
// Loading them is warm-up, not a decision: done on the warm-up budget
// (WarmTimeout), once for all the calls that found them gone meanwhile,
// and the call then gets a fresh decision timeout for its EVALSHA. So the
// first decision after a topology change is made by Redis, a little
// late, rather than counted as a store failure. loaded reports whether
// the scripts are known to be back (else the caller sends EVAL). cancel
// must be called.
func (s *RedisStore) rewarm(ctx context.Context) (rctx context.Context, cancel context.CancelFunc, loaded bool) {
	gen := s.warmGen.Load()
	s.warmMu.Lock()
	if s.warmGen.Load() != gen {
		// Another call loaded them while this one waited.
		loaded = true
	} else {
		s.noteReload()
		s.rewarms.Add(1)
		wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), s.warmTimeout)
		err := s.loadScripts(wctx)
		wcancel()
		if err == nil {
			s.warmGen.Add(1)
			loaded = true
		} else {
			s.log.Warn("redis: reloading the scripts after NOSCRIPT failed; sending them with the call", "err", err)
		}
	}
	s.warmMu.Unlock()
	rctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	return rctx, cancel, loaded
}

// Rewarms counts the calls that found the scripts gone (NOSCRIPT) and
// were given the warm-up budget.
func (s *RedisStore) Rewarms() int64 { return s.rewarms.Load() }

// ScriptSHAs are the SHA1 names of the scripts the store runs: what SCRIPT
// EXISTS answers 1 for on a warm server.
func ScriptSHAs() []string { return []string{scriptSHA, hotSHA} }
