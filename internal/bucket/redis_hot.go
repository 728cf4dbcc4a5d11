package bucket

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed hot.lua
var hotSrc string

var hotSHA = func() string {
	sum := sha1.Sum([]byte(hotSrc))
	return hex.EncodeToString(sum[:])
}()

var hotSHAArg, hotSrcArg any = hotSHA, hotSrc

const opMark = "mark"

// hotCmd builds one call of the hot-key script (hot.lua) for a take or a
// refund of req.
func (s *RedisStore) hotCmd(ctx context.Context, op string, req Request, sha bool) *redis.StringCmd {
	args := make([]any, 0, 11)
	if sha {
		args = append(args, "evalsha", hotSHAArg)
	} else {
		args = append(args, "eval", hotSrcArg)
	}
	args = append(args, 1, req.Key, op, s.args.number(req.Limit.Burst), s.args.number(req.Limit.Rate), s.args.number(req.Cost))
	if op == opTake {
		h := req.Hot
		args = append(args, s.args.number(h.PromoteAbove), h.Hold, h.Tau)
		if req.HeldFor > 0 {
			args = append(args, req.HeldFor)
		}
	}
	return redis.NewStringCmd(ctx, args...)
}

func (s *RedisStore) markCmd(ctx context.Context, m MarkRequest, sha bool) *redis.StringCmd {
	l := m.Limit
	args := make([]any, 0, 12)
	if sha {
		args = append(args, "evalsha", hotSHAArg)
	} else {
		args = append(args, "eval", hotSrcArg)
	}
	args = append(args, 1, m.Key, opMark, s.args.number(l.Burst), s.args.number(l.Rate),
		m.Epoch, formatFloat(m.Count), m.Hold, m.Tau, s.args.number(m.DemoteBelow))
	return redis.NewStringCmd(ctx, args...)
}

// MarkOutcome is one Mark answer, or an error for that mark alone.
type MarkOutcome struct {
	Result MarkResult
	Err    error
}

// Mark extends the marks of promoted hot keys (see MarkRequest and
// HotMark), all in one pipelined round trip. out must be at least as long
// as marks. A mark is safe to retry: it only extends, and its count is an
// estimate.
func (s *RedisStore) Mark(ctx context.Context, marks []MarkRequest, out []MarkOutcome) {
	out = out[:len(marks)]
	ctx, cancel := s.bound(ctx)
	defer cancel()
	cmds := make([]*redis.StringCmd, len(marks))
	for i, m := range marks {
		out[i] = MarkOutcome{}
		if err := m.Validate(); err != nil {
			out[i].Err = err
			continue
		}
		cmds[i] = s.markCmd(ctx, m, true)
	}
	s.pipeline(ctx, cmds, func(ctx context.Context, i int, sha bool) *redis.StringCmd { return s.markCmd(ctx, marks[i], sha) })
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		if err := cmd.Err(); err != nil {
			out[i].Err = s.fail(opMark, err)
			continue
		}
		reply, err := cmd.Result()
		if err == nil {
			out[i].Result, err = parseMarkReply(reply)
		}
		if err != nil {
			out[i].Err = fmt.Errorf("bucket: redis mark: %w", err)
		}
	}
}

// parseHotTakeReply reads a take reply of the hot-key script (hot.lua).
func parseHotTakeReply(reply string, l Limit, cost float64) (takeReply, error) {
	var r takeReply
	f := strings.Fields(reply)
	bad := func(err error) (takeReply, error) {
		if err == nil {
			err = errors.New("unexpected form")
		}
		return takeReply{}, fmt.Errorf("bucket: redis take: unexpected reply %q: %w", reply, err)
	}
	ints := func(ss ...string) ([]int64, error) {
		v := make([]int64, len(ss))
		for i, x := range ss {
			n, err := strconv.ParseInt(x, 10, 64)
			if err != nil {
				return nil, err
			}
			v[i] = n
		}
		return v, nil
	}
	switch {
	case len(f) == 4 && f[0] == "L":
		v, err := ints(f[1], f[2], f[3])
		if err != nil || v[0] <= 0 || v[1] <= 0 {
			return bad(err)
		}
		r.leased, r.promo, r.now = true, Promotion{Epoch: v[0], For: v[1]}, v[2]
		return r, nil
	case (len(f) == 3 || len(f) == 5) && (f[0] == "0" || f[0] == "1"):
		tokens, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return bad(err)
		}
		v, err := ints(f[2:]...)
		if err != nil {
			return bad(err)
		}
		r.tokens, r.now = tokens, v[0]
		r.decision = decided(f[0] == "1", tokens, l, cost)
		if len(f) == 5 {
			if v[1] <= 0 || v[2] <= 0 {
				return bad(nil)
			}
			r.promo = Promotion{Epoch: v[1], For: v[2]}
		}
		return r, nil
	}
	return bad(nil)
}

func parseMarkReply(reply string) (MarkResult, error) {
	f := strings.Fields(reply)
	if len(f) != 3 {
		return MarkResult{}, fmt.Errorf("unexpected reply %q", reply)
	}
	var r MarkResult
	switch f[0] {
	case "K":
		r.Verdict = MarkKept
	case "C":
		r.Verdict = MarkCool
	case "G":
		r.Verdict = MarkGone
	default:
		return MarkResult{}, fmt.Errorf("unexpected reply %q", reply)
	}
	var err1, err2 error
	r.For, err1 = strconv.ParseInt(f[1], 10, 64)
	r.Now, err2 = strconv.ParseInt(f[2], 10, 64)
	if err := errors.Join(err1, err2); err != nil || r.For < 0 {
		return MarkResult{}, fmt.Errorf("unexpected reply %q: %w", reply, err)
	}
	return r, nil
}
