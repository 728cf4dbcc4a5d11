package bucket

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultRedisTimeout bounds one Redis call when RedisOptions.Timeout is 0.
const DefaultRedisTimeout = 250 * time.Millisecond

// RedisOptions tunes a RedisStore. The zero value is usable.
type RedisOptions struct {
	// Timeout is the deadline of every call (Take, TakeBatch, Refund, Ping),
	// on top of the caller's context. 0 means DefaultRedisTimeout. The client
	// must honour context deadlines on its sockets (OpenRedis sets
	// ContextTimeoutEnabled); otherwise only its read/write timeouts apply.
	Timeout time.Duration
	// RequestIDTTL is how long a request id's decision is remembered; 0 means
	// DefaultRequestIDTTL. It is rounded up to whole milliseconds.
	RequestIDTTL time.Duration
	// Logger receives rare events (a script reloaded after NOSCRIPT); never
	// one line per decision. nil discards.
	Logger *slog.Logger
	// WarmTimeout bounds the calls that follow a NOSCRIPT answer (the
	// script sent again, maybe on new connections): warm-up after a
	// topology change, not decisions (see rewarm). 0 means
	// DefaultWarmTimeout.
	WarmTimeout time.Duration
	// DisableAutoPipeline sends each Take and Refund on a pooled connection
	// of its own instead of through the client's automatic pipeliner (go-redis
	// AsyncAutoPipeline, experimental in v9.23), which batches concurrent
	// calls into shared round trips. Measured on loopback (bench_test.go):
	// about 2x the decisions per second at 64 concurrent callers, for some
	// 10-20µs more latency when a caller is alone. TakeBatch always sends
	// one explicit pipeline.
	DisableAutoPipeline bool
}

// RedisStore keeps buckets in Redis: one key per bucket, changed only by one
// Lua script (redis.lua) that reads the server clock, refills, decides and
// writes atomically, so every agent sharing the Redis sees one balance.
//
// The script is run by EVALSHA and, when the server answers NOSCRIPT (a
// restart, a failover to a replica that never saw it, SCRIPT FLUSH), by EVAL,
// which also caches it again: no call fails for it, and that call gets the
// warm-up budget (RedisOptions.WarmTimeout), not the decision's. Warm loads
// the scripts and opens connections before the first decision. Decisions go to the
// primary only; pass a client that routes writes there (OpenRedis does: no
// replica reads, no latency routing).
//
// Concurrent Take and Refund calls share round trips through the client's
// automatic pipeliner unless RedisOptions.DisableAutoPipeline; each call
// still returns by its own deadline (a reply that comes later is dropped, its
// outcome uncertain, as with any timeout).
//
// Retries: go-redis retries a command that failed on the network (MaxRetries)
// and so may run a take twice when the first reply was lost: the bucket is
// charged twice (never credited twice). A take with a RequestID is replayed
// instead, charging once. A refund without a RequestID is never retried,
// since running it twice would credit twice; with an id it is safe to retry.
type RedisStore struct {
	c       redis.UniversalClient
	ap      *redis.AutoPipeliner // nil: plain pooled calls
	timeout time.Duration
	ridTTL  any // request-id TTL, milliseconds (a string)
	args    numberCache
	ttls    argCache[[2]uint64] // bucket TTLs (scriptTTL), by burst and rate bits
	log     *slog.Logger
	// lastReload is when a NOSCRIPT reload was last logged (unix ns), so a
	// failover that reloads on many connections logs once.
	lastReload atomic.Int64
	// warmTimeout bounds the script loads after a NOSCRIPT (rewarm);
	// rewarms counts them, warmGen counts the ones that succeeded (the
	// calls that waited on warmMu meanwhile need not load again).
	warmTimeout time.Duration
	rewarms     atomic.Int64
	warmGen     atomic.Int64
	warmMu      sync.Mutex
	// owners: each slot's last known master (a Cluster's; nil otherwise).
	owners *slotOwners
	// unserved: the slots a master answered "not served" for (no master
	// owns them), until a topology read shows an owner (a Cluster's).
	unserved *slotFlags
	// nodeAP: a Cluster's decisions are pipelined per master (doNode).
	nodeAP bool
	// nodeAPs caches each master client's pipeliner (go-redis takes a
	// lock to hand it out) and whether it is warm (redis_rewarm.go).
	nodeAPs sync.Map // *redis.Client -> *nodeConn
	// nodeConnHook, for tests, runs in nodeConn between a missed lookup
	// and the store of a new entry: where concurrent first uses race.
	nodeConnHook func()
	// warmups counts the new masters warmed after a topology change, by
	// cause; outageWarmups the nodes WarmNode warmed again.
	warmups       [2]atomic.Int64
	outageWarmups atomic.Int64
}

//go:embed redis.lua
var scriptSrc string

// scriptSHA is what EVALSHA names the script by.
var scriptSHA = func() string {
	sum := sha1.Sum([]byte(scriptSrc))
	return hex.EncodeToString(sum[:])
}()

// The script and its name as command arguments, boxed once rather than
// once per call.
var scriptSHAArg, scriptSrcArg any = scriptSHA, scriptSrc

const (
	opTake   = "take"
	opRefund = "refund"
	opTakes  = "takes"
)

// The operations as command arguments, boxed once: a string variable boxed
// per call is an allocation per decision.
var opTakeArg, opRefundArg, opTakesArg any = opTake, opRefund, opTakes

func opArg(op string) any {
	if op == opTake {
		return opTakeArg
	}
	return opRefundArg
}

// NewRedisStore returns a store over c. It does no I/O: the script is loaded
// by the first call that needs it. The store does not own c: closing c (which
// also stops its automatic pipeliner) is the caller's job, after the last
// call.
func NewRedisStore(c redis.UniversalClient, opts RedisOptions) *RedisStore {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultRedisTimeout
	}
	if opts.RequestIDTTL <= 0 {
		opts.RequestIDTTL = DefaultRequestIDTTL
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.WarmTimeout <= 0 {
		opts.WarmTimeout = DefaultWarmTimeout
	}
	ms := (opts.RequestIDTTL + time.Millisecond - 1) / time.Millisecond
	s := &RedisStore{
		c:           c,
		warmTimeout: max(opts.WarmTimeout, opts.Timeout),
		timeout:     opts.Timeout,
		ridTTL:      any(strconv.FormatInt(int64(ms), 10)),
		log:         opts.Logger,
	}
	if _, ok := c.(*redis.ClusterClient); ok {
		s.owners = new(slotOwners)
		s.unserved = new(slotFlags)
	}
	if !opts.DisableAutoPipeline && s.owners != nil {
		// A Cluster's decisions go through each master's own pipeliner
		// (doNode), not the cluster client's: the cluster's shares a
		// batch stream among masters by slot, so one dead master's batch,
		// retried until its deadline, held up the decisions of healthy
		// masters queued behind it.
		s.nodeAP = true
	} else if !opts.DisableAutoPipeline {
		ap, err := c.AsyncAutoPipeline()
		if err != nil {
			s.log.Warn("redis automatic pipelining unavailable; deciding on pooled connections", "err", err)
		} else {
			s.ap = ap
		}
	}
	return s
}

// Take charges req.Cost against req.Key's bucket and reports the decision.
// A repeated RequestID returns the recorded decision (Replayed) and charges
// nothing. Bad input fails with ErrInvalid or ErrCostExceedsBurst before any
// I/O; Redis failures wrap ErrUnavailable.
func (s *RedisStore) Take(ctx context.Context, req Request) (Result, error) {
	r, err := s.take(ctx, req)
	if err != nil {
		return Result{}, err
	}
	return r.result(), nil
}

// take is Take with the script's reply as it came (floats unconverted).
func (s *RedisStore) take(ctx context.Context, req Request) (takeReply, error) {
	if err := req.Validate(); err != nil {
		return takeReply{}, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	cmd := s.cmd(ctx, opTake, req, true)
	err := s.doKey(ctx, req.Key, cmd)
	if isNoScript(err) {
		wctx, wcancel, loaded := s.rewarm(ctx)
		defer wcancel()
		cmd = s.cmd(wctx, opTake, req, loaded)
		err = s.doKey(wctx, req.Key, cmd)
	}
	if err != nil {
		s.markUnserved(req.Key, err)
		return takeReply{}, s.fail(opTake, err)
	}
	return parseTake(cmd, req)
}

// bound limits ctx to the store's timeout. A context whose deadline comes
// no later is used as it is: the agent gives every decision a deadline of
// its own, as long as this timeout, and a second timer per call would only
// cost (a timer, two contexts and the parent's map of children).
func (s *RedisStore) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= s.timeout {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, s.timeout)
}

func noCancel() {}

// pipeline runs cmds (nil entries skipped, each by EVALSHA) in one
// pipeline round trip; those the server answered NOSCRIPT are sent again
// in one more once the scripts are loaded (rewarm), rebuilt by
// eval(ctx, i, sha): by EVALSHA when the load succeeded, else by EVAL
// (which also caches the script). Errors stay on each command.
func (s *RedisStore) pipeline(ctx context.Context, cmds []*redis.StringCmd, eval func(ctx context.Context, i int, sha bool) *redis.StringCmd) {
	pipe := s.c.Pipeline()
	for _, cmd := range cmds {
		if cmd != nil {
			_ = pipe.Process(ctx, cmd)
		}
	}
	if pipe.Len() == 0 {
		return
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	var again redis.Pipeliner
	wctx, loaded := ctx, false
	for i, cmd := range cmds {
		if cmd != nil && isNoScript(cmd.Err()) {
			if again == nil {
				var wcancel context.CancelFunc
				wctx, wcancel, loaded = s.rewarm(ctx)
				defer wcancel()
				again = s.c.Pipeline()
			}
			cmds[i] = eval(wctx, i, loaded)
			_ = again.Process(wctx, cmds[i])
		}
	}
	if again != nil {
		_, _ = again.Exec(wctx)
	}
}

// TakeBatch decides every request in one pipeline round trip (a Redis
// Cluster client splits it per node and runs the parts concurrently).
// Requests on the same key are decided in order. out[i] answers reqs[i]; an
// invalid request fails alone, without I/O. len(out) must be at least
// len(reqs): TakeBatch panics otherwise.
//
// On one server (not a Cluster), consecutive plain takes (no request id, not
// hot, not held) go up to maxBatchKeys at a time in one script call ("takes"), which
// decides each exactly as its own call would, on one reading of the
// server's clock: the script's call overhead, its TIME and its number
// parsing are paid once per call instead of once per decision. An error of
// such a call (the network, a timeout) is every one of its decisions'; a
// key holding something other than a bucket fails only its own decision,
// with the error a lone take on it gets, and is left as it was.
func (s *RedisStore) TakeBatch(ctx context.Context, reqs []Request, out []Outcome) {
	out = out[:len(reqs)]
	s.takeBatch(ctx, reqs, func(i int, r takeReply, err error) {
		if err != nil {
			out[i] = Outcome{Err: err}
			return
		}
		out[i] = Outcome{Result: r.result()}
	})
}

// maxBatchKeys bounds the decisions of one "takes" script call, so that
// one call holds the server (which runs nothing else meanwhile) for some
// hundreds of microseconds at most.
const maxBatchKeys = 128

// batchPart is one script call of a batch: reqs[first:first+n], by "takes"
// when multi, else the one request's own call.
type batchPart struct {
	first, n int
	multi    bool
}

// takeBatch is TakeBatch answering each request through answer, with the
// script's reply as it came.
func (s *RedisStore) takeBatch(ctx context.Context, reqs []Request, answer func(i int, r takeReply, err error)) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	ctx, wcancel := s.awaitWarmKeys(ctx, reqs)
	defer wcancel()
	_, cluster := s.c.(*redis.ClusterClient)
	parts := make([]batchPart, 0, 1+len(reqs)/maxBatchKeys)
	plain := func(r *Request) bool { return !cluster && r.RequestID == "" && r.Hot == nil && r.HeldFor == 0 }
	for i := 0; i < len(reqs); {
		if err := reqs[i].Validate(); err != nil {
			answer(i, takeReply{}, err)
			i++
			continue
		}
		p := batchPart{first: i, n: 1}
		if plain(&reqs[i]) {
			for p.n < maxBatchKeys && i+p.n < len(reqs) {
				next := &reqs[i+p.n]
				if !plain(next) || next.Validate() != nil {
					break
				}
				p.n++
			}
			p.multi = p.n > 1
		}
		parts = append(parts, p)
		i += p.n
	}
	buildCtx := func(ctx context.Context, k int, sha bool) *redis.StringCmd {
		p := parts[k]
		if p.multi {
			return s.takesCmd(ctx, reqs[p.first:p.first+p.n], sha)
		}
		return s.cmd(ctx, opTake, reqs[p.first], sha)
	}
	build := func(k int, sha bool) *redis.StringCmd { return buildCtx(ctx, k, sha) }
	cmds := make([]*redis.StringCmd, len(parts))
	for k := range parts {
		cmds[k] = build(k, true)
	}
	s.pipeline(ctx, cmds, func(ctx context.Context, k int, sha bool) *redis.StringCmd { return buildCtx(ctx, k, sha) })
	for k, p := range parts {
		cmd := cmds[k]
		if err := cmd.Err(); err != nil {
			s.markUnserved(reqs[p.first].Key, err)
			err = s.fail(opTake, err)
			for i := p.first; i < p.first+p.n; i++ {
				answer(i, takeReply{}, err)
			}
			continue
		}
		if p.multi {
			parseTakesReply(cmd.Val(), reqs[p.first:p.first+p.n], func(j int, r takeReply, err error) {
				answer(p.first+j, r, err)
			})
			continue
		}
		r, err := parseTake(cmd, reqs[p.first])
		answer(p.first, r, err)
	}
}

// Refund gives req.Cost back to req.Key's bucket, capped at its burst. With a
// RequestID it refunds only a decision recorded under that id as allowed and
// not yet refunded, and marks it refunded, so a retried refund credits once.
// Without an id it always refunds (and is never retried by the client).
func (s *RedisStore) Refund(ctx context.Context, req Request) error {
	_, _, err := s.refund(ctx, req)
	return err
}

// refund reports whether the bucket was credited (a missing bucket, being
// full, counts as credited) and the server time the script used.
func (s *RedisStore) refund(ctx context.Context, req Request) (refunded bool, now int64, err error) {
	if err := req.Validate(); err != nil {
		return false, 0, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	run := func(sha bool) (*redis.StringCmd, error) {
		cmd := s.cmd(ctx, opRefund, req, sha)
		if req.RequestID == "" {
			return cmd, s.doKey(ctx, req.Key, noRetryCmd{cmd})
		}
		return cmd, s.doKey(ctx, req.Key, cmd)
	}
	cmd, err := run(true)
	if isNoScript(err) {
		wctx, wcancel, loaded := s.rewarm(ctx)
		defer wcancel()
		ctx = wctx
		cmd, err = run(loaded)
	}
	if err != nil {
		return false, 0, s.fail(opRefund, err)
	}
	reply, err := cmd.Result()
	flag, ts, ok := strings.Cut(reply, " ")
	if err == nil && ok && (flag == "0" || flag == "1") {
		if now, err = strconv.ParseInt(ts, 10, 64); err == nil {
			return flag == "1", now, nil
		}
	}
	return false, 0, fmt.Errorf("bucket: redis refund: unexpected reply %q (%v)", reply, err)
}

// Ping checks that Redis answers (every master of a cluster).
func (s *RedisStore) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var err error
	if cc, ok := s.c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Ping(ctx).Err()
		})
	} else {
		err = s.c.Ping(ctx).Err()
	}
	if err != nil {
		return s.fail("ping", err)
	}
	return nil
}

// do runs one command, returning by ctx's deadline. Through the automatic
// pipeliner the command is not cancelled at the deadline (it is already in a
// shared batch): only the wait for it ends, and cmd must not be read then.
func (s *RedisStore) do(ctx context.Context, cmd redis.Cmder) error { return s.doKey(ctx, "", cmd) }

// doKey is do for a command on key: on a Cluster, through the pipeliner of
// key's master (doNode).
func (s *RedisStore) doKey(ctx context.Context, key string, cmd redis.Cmder) error {
	if s.nodeAP && key != "" {
		return s.doNode(ctx, key, cmd)
	}
	if s.ap != nil {
		return s.ap.Submit(ctx, cmd).WaitContext(ctx)
	}
	return s.c.Process(ctx, cmd)
}

// doNode runs cmd through the automatic pipeliner of the master that owns
// key, so that a master down delays only its own keys' commands. A
// redirection (MOVED, ASK: a slot that moved since go-redis last read the
// topology) is followed by the cluster client, which also reads the new
// topology for the commands after it.
func (s *RedisStore) doNode(ctx context.Context, key string, cmd redis.Cmder) error {
	cc := s.c.(*redis.ClusterClient)
	n, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return s.c.Process(ctx, cmd)
	}
	nc, err := s.nodeConn(n)
	if err != nil {
		return s.c.Process(ctx, cmd)
	}
	// A master never used (a topology change) is warmed first.
	ctx, cancel := s.awaitWarm(ctx, nc, n)
	defer cancel()
	err = nc.ap.Submit(ctx, cmd).WaitContext(ctx)
	if err == nil {
		return nil
	}
	_, moved := redis.IsMovedError(err)
	_, ask := redis.IsAskError(err)
	if !moved && !ask {
		return err
	}
	cmd.SetErr(nil)
	return s.c.Process(ctx, cmd)
}
