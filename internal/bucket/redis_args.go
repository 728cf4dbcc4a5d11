package bucket

// The bucket script's arguments, formatted once per distinct value.

import (
	"context"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

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
