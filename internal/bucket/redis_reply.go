package bucket

// The bucket script's replies, read exactly as the script wrote them.

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

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
