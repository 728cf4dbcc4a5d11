package bucket

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// takesCmd builds one "takes" script call deciding reqs in order: plain
// takes, already valid. Keys go in as pointers into reqs (see scriptArgs),
// which must not change until the call returns.
func (s *RedisStore) takesCmd(ctx context.Context, reqs []Request, sha bool) *redis.StringCmd {
	args := make([]any, 0, 4+5*len(reqs))
	if sha {
		args = append(args, "evalsha", scriptSHAArg)
	} else {
		args = append(args, "eval", scriptSrcArg)
	}
	args = append(args, len(reqs))
	for i := range reqs {
		args = append(args, &reqs[i].Key)
	}
	args = append(args, opTakesArg)
	for i := range reqs {
		r := &reqs[i]
		args = append(args, s.args.number(r.Limit.Burst), s.args.number(r.Limit.Rate), s.args.number(r.Cost), s.ttl(r.Limit))
	}
	return redis.NewStringCmd(ctx, args...)
}

// parseTakesReply reads a "takes" reply: now (8 bytes), then per request
// its allowed ('0' or '1') and its stored bucket (24 bytes, tokens first),
// answering each of reqs in turn. A reply that does not read, or does not
// answer exactly len(reqs) decisions (a script out of step with this
// store), fails every one of them.
func parseTakesReply(reply string, reqs []Request, answer func(j int, r takeReply, err error)) {
	bad := func(j int, why error) {
		err := fmt.Errorf("bucket: redis takes: unexpected reply %q: %w", reply, why)
		for ; j < len(reqs); j++ {
			answer(j, takeReply{}, err)
		}
	}
	const each = 1 + storedBytes
	if len(reply) != 8+each*len(reqs) {
		bad(0, fmt.Errorf("%d bytes for %d decisions (want %d)", len(reply), len(reqs), 8+each*len(reqs)))
		return
	}
	now, err := readNow(reply[:8])
	if err != nil {
		bad(0, err)
		return
	}
	for j := range reqs {
		d := reply[8+each*j:]
		flag := d[0]
		if flag == 'e' {
			answer(j, takeReply{}, foreignValue(reqs[j].Key, readFloat(d[1:9])))
			continue
		}
		if flag != '0' && flag != '1' {
			bad(j, fmt.Errorf("decision %d: allowed %q, not 0 or 1", j+1, flag))
			return
		}
		r := takeReply{now: now}
		r.decision = decided(flag == '1', readFloat(d[1:9]), reqs[j].Limit, reqs[j].Cost)
		answer(j, r, nil)
	}
}

// foreignValue is the error of a decision in a "takes" call whose key held
// something other than a bucket (the script left it untouched): size bytes
// of a string, or another type when size is -1. It reads as the error a
// lone take gets from the script for the same key.
func foreignValue(key string, size float64) error {
	if size < 0 {
		return fmt.Errorf("bucket: redis take: WRONGTYPE: key %q holds a value of another type, not a Ration token bucket", key)
	}
	return fmt.Errorf("bucket: redis take: key %q holds %v bytes, not a Ration token bucket (%d or %d)", key, size, storedBytes, heldBytes)
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

// cmd builds one script call. sha selects EVALSHA (else EVAL, which also
// caches the script on that server). The request-id TTL goes only with a
// request id, the one case the script reads it; the bucket's TTL always.
//
// The scripts answer every call with a string, so the command is a
// StringCmd: it keeps the reply as the string it reads, where a Cmd boxes
// it into an interface (an allocation per decision) for Text to unbox.
// Any other reply is an error either way (Text refuses a non-string; a
// StringCmd reads an integer as its digits, which no reply parser takes,
// and refuses an array).
func (s *RedisStore) cmd(ctx context.Context, op string, req Request, sha bool) *redis.StringCmd {
	if req.Hot != nil {
		return s.hotCmd(ctx, op, req, sha)
	}
	a := new(scriptArgs)
	args := a.args[:0]
	if sha {
		args = append(args, "evalsha", scriptSHAArg)
	} else {
		args = append(args, "eval", scriptSrcArg)
	}
	a.keys[0] = req.Key
	if req.RequestID != "" {
		a.keys[1] = requestIDKey(req.Key, req.RequestID)
		args = append(args, 2, &a.keys[0], &a.keys[1])
	} else {
		args = append(args, 1, &a.keys[0])
	}
	args = append(args, opArg(op), s.args.number(req.Limit.Burst), s.args.number(req.Limit.Rate), s.args.number(req.Cost), s.ttl(req.Limit))
	if req.RequestID != "" {
		args = append(args, s.ridTTL)
	} else if req.HeldFor > 0 {
		args = append(args, "0", req.HeldFor)
	}
	return redis.NewStringCmd(ctx, args...)
}

// scriptArgs is one script call's arguments and the keys they name, made
// in one allocation. A key goes in as a pointer to its string here, which
// an interface holds without boxing (a string would be boxed: one more
// allocation per key per call); go-redis writes a *string as the string it
// points to and reads it as one wherever it looks at keys (Cluster slot
// routing, its batch sizing; only the command's String, a debugging aid,
// prints it as an address). The array is as long as the longest call
// (two keys and the request-id TTL, or one key and a held take's two
// more): append never moves args off it.
type scriptArgs struct {
	args [11]any
	keys [2]string
}

// numberCache holds numbers as script arguments, by their bits (so -0 is
// not 0).
type numberCache struct{ argCache[uint64] }

// number is v as a script argument (formatFloat), formatted once per
// distinct value.
func (c *numberCache) number(v float64) any {
	bits := math.Float64bits(v)
	if a, ok := c.get(bits); ok {
		return a
	}
	return c.put(bits, formatFloat(v))
}

// ttl is l's bucket TTL as a script argument (scriptTTL), formatted once
// per rule shape.
func (s *RedisStore) ttl(l Limit) any {
	k := [2]uint64{math.Float64bits(l.Burst), math.Float64bits(l.Rate)}
	if a, ok := s.ttls.get(k); ok {
		return a
	}
	return s.ttls.put(k, scriptTTL(l))
}

// scriptTTL is the time to live, in whole milliseconds, that the script
// gives a bucket of limit l whose last is now (the usual case: a clock that
// stepped back is the script's own to count), or "0" for none: twice the
// least lifetime (expiresAfter's), rounded up, so that later decisions can
// keep it rather than set one each (redis.lua, Expiry). It is the script's
// arithmetic, operation for operation (and a refill of 0 µs is kept
// forever as the script always did), so the script takes it as an
// argument instead of computing and formatting it per call.
func scriptTTL(l Limit) string {
	if !(l.Rate > 0) {
		return "0"
	}
	full := math.Ceil(l.Burst / l.Rate * 1e6)
	if !(full > 0 && full < float64(keepForever)) {
		return "0"
	}
	ttl := int64(full) + int64(expiryMargin/time.Microsecond)
	if ttl >= keepForever {
		return "0"
	}
	return strconv.FormatInt((2*ttl+999)/1000, 10)
}

// argCache holds script arguments formatted and boxed once, not once per
// call. Requests carry few distinct numbers (the rules' bursts and rates,
// and costs, nearly always 1); past maxCachedArgs of them, further ones are
// formatted per call. Reads take no lock.
type argCache[K comparable] struct {
	m  atomic.Pointer[map[K]any]
	mu sync.Mutex // serializes writers (copy on write)
}

const maxCachedArgs = 1024

func (c *argCache[K]) get(k K) (any, bool) {
	if m := c.m.Load(); m != nil {
		a, ok := (*m)[k]
		return a, ok
	}
	return nil, false
}

// put caches v under k (unless the cache is full) and returns it boxed.
func (c *argCache[K]) put(k K, v string) any {
	a := any(v)
	c.mu.Lock()
	defer c.mu.Unlock()
	var old map[K]any
	if p := c.m.Load(); p != nil {
		old = *p
	}
	if len(old) >= maxCachedArgs {
		return a
	}
	next := make(map[K]any, 1+len(old))
	for k, v := range old {
		next[k] = v
	}
	next[k] = a
	c.m.Store(&next)
	return a
}

// requestIDKey names the record of one request id. It shares the bucket
// key's hash tag, so both are in one Redis Cluster slot; a key without a
// hash tag (Key always adds one) cannot use request ids on a Cluster.
func requestIDKey(key, id string) string { return key + ":r:" + id }

// formatFloat writes the shortest decimal that reads back (strtod, in the
// script) as exactly v.
func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// parseTake reads the script's take reply to req: the text form with a
// request id (parseTakeReply), else the binary one (parseStateReply).
func parseTake(cmd *redis.StringCmd, req Request) (takeReply, error) {
	reply, err := cmd.Result()
	if err != nil {
		return takeReply{}, fmt.Errorf("bucket: redis take: reply: %w", err)
	}
	if req.Hot != nil {
		return parseHotTakeReply(reply, req.Limit, req.Cost)
	}
	if req.RequestID != "" {
		return parseTakeReply(reply)
	}
	return parseStateReply(reply, req.Limit, req.Cost)
}

// takeReply is the script's take reply, floats as the script computed them.
type takeReply struct {
	decision
	now      int64
	replayed bool
	leased   bool
	promo    Promotion
}

func (r takeReply) result() Result {
	res := r.decision.result(r.now)
	res.Replayed = r.replayed
	res.Leased, res.Promotion = r.leased, r.promo
	if r.leased {
		res.Remaining, res.RetryAfter, res.Reset = 0, 0, 0
	}
	return res
}

// storedBytes is the length of a bucket as the script stores it: tokens,
// last and exp, three little-endian float64 (redis.lua).
const storedBytes = 24

// heldBytes is the length of a bucket while held takes hold something
// (two more float64: held, held until); the script replies its first
// storedBytes.
const heldBytes = 40

// parseStateReply reads the take reply of a decision just made, for limit
// l and cost: allowed ('0' or '1'), the bucket as stored (tokens, last,
// exp), and now (one more float64) when it is not last. Retry and reset
// are derived from tokens here, by the model's own operations (decided),
// exactly as the script would have computed them.
func parseStateReply(reply string, l Limit, cost float64) (takeReply, error) {
	var r takeReply
	if (len(reply) != 1+storedBytes && len(reply) != 1+storedBytes+8) || (reply[0] != '0' && reply[0] != '1') {
		return r, fmt.Errorf("bucket: redis take: unexpected reply %q: want allowed and %d or %d bytes", reply, storedBytes, storedBytes+8)
	}
	at := reply[9:17] // last, which is now
	if len(reply) > 1+storedBytes {
		at = reply[1+storedBytes:]
	}
	now, err := readNow(at)
	if err != nil {
		return r, fmt.Errorf("bucket: redis take: unexpected reply %q: %w", reply, err)
	}
	r.now = now
	r.decision = decided(reply[0] == '1', readFloat(reply[1:9]), l, cost)
	return r, nil
}

// readFloat reads a little-endian float64 (struct.pack '<d' in the script)
// from b's first 8 bytes.
func readFloat(b string) float64 {
	_ = b[7]
	return math.Float64frombits(uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56)
}

// readNow reads the server time (µs) the script packed as a float64: a
// whole number of microseconds, exact below 2^53.
func readNow(b string) (int64, error) {
	v := readFloat(b)
	if !(v >= 0 && v < 1<<53) || v != math.Trunc(v) {
		return 0, fmt.Errorf("server time %v is not a whole number of microseconds", v)
	}
	return int64(v), nil
}

// parseTakeReply reads the take reply to a request with a request id,
// "<allowed> <tokens> <retry s> <reset s> <now µs> <replayed>": the
// decision as its record holds it, waits included, so a replay answers with
// them as they were decided even if the rule's shape has changed since.
func parseTakeReply(reply string) (takeReply, error) {
	var r takeReply
	var f [6]string
	n := 0
	for rest, more := reply, true; more; n++ {
		if n == len(f) {
			return r, fmt.Errorf("bucket: redis take: unexpected reply %q", reply)
		}
		f[n], rest, more = strings.Cut(rest, " ")
	}
	if n != 6 {
		return r, fmt.Errorf("bucket: redis take: unexpected reply %q", reply)
	}
	var errs [5]error
	r.allowed = f[0] == "1"
	r.tokens, errs[0] = strconv.ParseFloat(f[1], 64)
	r.retry, errs[1] = strconv.ParseFloat(f[2], 64)
	r.reset, errs[2] = strconv.ParseFloat(f[3], 64)
	r.now, errs[3] = strconv.ParseInt(f[4], 10, 64)
	r.replayed = f[5] == "1"
	if f[5] != "0" && f[5] != "1" || f[0] != "0" && f[0] != "1" {
		errs[4] = errors.New("flags must be 0 or 1")
	}
	if err := errors.Join(errs[:]...); err != nil {
		return r, fmt.Errorf("bucket: redis take: unexpected reply %q: %w", reply, err)
	}
	return r, nil
}

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
