package bucket_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
)

// testTimeout is the store deadline in tests that expect answers: generous,
// since -race on two cores is slow. Tests never assert on speed.
const testTimeout = 5 * time.Second

// openRedis opens spec as the agent would, closed when t ends.
func openRedis(t testing.TB, spec string, timeout time.Duration) redis.UniversalClient {
	t.Helper()
	c, err := bucket.OpenRedis(spec, timeout)
	if err != nil {
		t.Fatalf("OpenRedis(%q): %v", spec, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// countHook counts dials and commands that a client sends.
type countHook struct{ n atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.n.Add(1)
		return next(ctx, network, addr)
	}
}

func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// redisFixture is a fresh client and store over spec, for one subtest;
// inspect looks at the servers directly.
func redisFixture(t *testing.T, spec string, inspect redis.UniversalClient, opts bucket.RedisOptions) *fixture {
	c := openRedis(t, spec, testTimeout)
	hook := &countHook{}
	c.AddHook(hook)
	return &fixture{
		store: bucket.NewRedisStore(c, opts),
		wait:  time.Sleep,
		held:  func(t *testing.T, key string) bool { return redisHolds(t, inspect, key) },
		io:    hook.n.Load,
	}
}

// redisHolds reports whether key or any request-id record of it exists.
func redisHolds(t *testing.T, c redis.UniversalClient, key string) bool {
	t.Helper()
	ctx := context.Background()
	var node redis.Cmdable = c
	if cc, ok := c.(*redis.ClusterClient); ok {
		n, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatalf("master for %s: %v", key, err)
		}
		node = n
	}
	if n, err := node.Exists(ctx, key).Result(); err != nil || n > 0 {
		if err != nil {
			t.Fatalf("EXISTS %s: %v", key, err)
		}
		return true
	}
	keys, err := node.Keys(ctx, globEscape(bucket.RequestIDKey(key, "*"))).Result()
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	return len(keys) > 0
}

// globEscape escapes the glob characters of s, but keeps a trailing '*'.
func globEscape(s string) string {
	body, star := strings.CutSuffix(s, "*")
	var b strings.Builder
	for _, r := range body {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	if star {
		b.WriteByte('*')
	}
	return b.String()
}

func TestRedisStore(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t)
	for _, mode := range []struct {
		name    string
		disable bool
	}{{"autopipeline", false}, {"pooled", true}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			opts := bucket.RedisOptions{Timeout: testTimeout, DisableAutoPipeline: mode.disable}
			runStoreSuite(t, func(t *testing.T) *fixture { return redisFixture(t, srv.Addr, srv.Client(), opts) })
		})
	}
}

func TestRedisStoreCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := harness.StartCluster(t)
	spec := "redis-cluster://" + strings.Join(cl.Addrs, ",")
	runStoreSuite(t, func(t *testing.T) *fixture {
		return redisFixture(t, spec, cl.Client(), bucket.RedisOptions{Timeout: testTimeout})
	})

	t.Run("buckets on every master", func(t *testing.T) {
		s := bucket.NewRedisStore(openRedis(t, spec, testTimeout), bucket.RedisOptions{Timeout: testTimeout})
		perNode := map[*harness.Redis][]string{}
		for i := 0; len(perNode) < len(cl.Nodes) || minLen(perNode) < 2; i++ {
			k := bucket.Key("spread", strconv.Itoa(i))
			slot, err := cl.Client().ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT %s: %v", k, err)
			}
			n := cl.NodeForSlot(int(slot))
			perNode[n] = append(perNode[n], k)
		}
		l := bucket.Limit{Burst: 3, Rate: 0}
		for owner, keys := range perNode {
			for _, k := range keys[:2] {
				for i := 0; i < 4; i++ {
					res := mustTake(t, s, bucket.Request{Key: k, Limit: l, Cost: 1, RequestID: "r" + strconv.Itoa(i)})
					if want := i < 3; res.Allowed != want || res.Remaining != float64(max(0, 2-i)) {
						t.Errorf("%s take %d: %+v, want allowed=%v", k, i+1, res, want)
					}
				}
				if res := mustTake(t, s, bucket.Request{Key: k, Limit: l, Cost: 1, RequestID: "r0"}); !res.Replayed {
					t.Errorf("%s: repeated id not replayed: %+v", k, res)
				}
				for _, n := range cl.Nodes {
					// KEYS, unlike EXISTS, answers on a node that does not own the slot.
					var got int
					for _, name := range []string{k, bucket.RequestIDKey(k, "r0")} {
						keys, err := n.Client().Keys(ctx, globEscape(name)).Result()
						if err != nil {
							t.Fatalf("KEYS on %s: %v", n.Addr, err)
						}
						got += len(keys)
					}
					if want := map[bool]int{true: 2, false: 0}[n == owner]; got != want {
						t.Errorf("%s and its id record: %d of them on %s, want %d (owner %s)", k, got, n.Addr, want, owner.Addr)
					}
				}
			}
		}
		out := make([]bucket.Outcome, 0, 6)
		var batch []bucket.Request
		for _, keys := range perNode {
			batch = append(batch, bucket.Request{Key: keys[0], Limit: l, Cost: 1}, bucket.Request{Key: keys[1], Limit: l, Cost: 1})
		}
		out = out[:len(batch)]
		s.TakeBatch(ctx, batch, out)
		for i, o := range out {
			if o.Err != nil || o.Result.Allowed {
				t.Errorf("batch on spent buckets across nodes [%d] %s: %+v, want denied", i, batch[i].Key, o)
			}
		}
	})

	// Concurrent first decisions on a master race to cache its pipeliner;
	// go-redis hands each the same one, and whichever loses must leave it
	// open: the decisions after them are served.
	t.Run("first uses of a master race", func(t *testing.T) {
		s := bucket.NewRedisStore(openRedis(t, spec, testTimeout), bucket.RedisOptions{Timeout: testTimeout})
		var arrived atomic.Int32
		both := make(chan struct{})
		bucket.SetNodeConnHook(s, func() {
			// The first two callers pass only together: each has missed
			// the cache and holds the pipeliner before either stores it.
			switch arrived.Add(1) {
			case 1:
				select {
				case <-both:
				case <-time.After(5 * time.Second):
				}
			case 2:
				close(both)
			}
		})
		req := bucket.Request{Key: bucket.Key("race", "first"), Limit: bucket.Limit{Burst: 10, Rate: 0}, Cost: 1}
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := s.Take(ctx, req)
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		if arrived.Load() < 2 {
			t.Fatalf("%d first uses met in nodeConn, want 2", arrived.Load())
		}
		for err := range errs {
			if err != nil {
				t.Errorf("racing first take: %v", err)
			}
		}
		if res, err := s.Take(ctx, req); err != nil || !res.Allowed || res.Remaining != 7 {
			t.Fatalf("take after the race = %+v, %v; want allowed with 7 left", res, err)
		}
	})

	t.Run("CheckVersion on every master", func(t *testing.T) {
		if w, err := bucket.CheckVersion(ctx, openRedis(t, spec, testTimeout)); err != nil || w != "" {
			t.Errorf("CheckVersion = %q, %v; want no warning", w, err)
		}
	})

	t.Run("CheckEviction on every master", func(t *testing.T) {
		c := openRedis(t, spec, testTimeout)
		if p, w, err := bucket.CheckEviction(ctx, c); err != nil || p != "noeviction" || w != "" {
			t.Fatalf("CheckEviction = %q, %q, %v; want noeviction and no warning", p, w, err)
		}
		odd := cl.Nodes[1]
		if err := odd.Client().ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
			t.Fatal(err)
		}
		defer odd.Client().ConfigSet(ctx, "maxmemory-policy", "noeviction")
		p, w, err := bucket.CheckEviction(ctx, c)
		if err != nil || !strings.Contains(p, odd.Addr+"=allkeys-lru") || !strings.Contains(w, odd.Addr) || strings.Contains(w, cl.Nodes[0].Addr) {
			t.Errorf("CheckEviction with %s on allkeys-lru = %q, %q, %v; want that node named", odd.Addr, p, w, err)
		}
	})
}

func minLen(m map[*harness.Redis][]string) int {
	n := math.MaxInt
	for _, v := range m {
		n = min(n, len(v))
	}
	return n
}

// scriptCheck runs the script and the model side by side on one bucket:
// the model is fed the server time the script used, and both the replies
// and the stored hash must agree with it bit for bit.
type scriptCheck struct {
	s       *bucket.RedisStore
	c       *redis.Client // inspection
	key     string
	l       bucket.Limit
	st      bucket.State
	exists  bool
	hash    bool // the bucket is in the form of earlier versions (inject), not written since
	ids     map[string]*idRecord
	lastNow int64 // latest server time seen
}

type idRecord struct {
	reply    bucket.Decision
	refunded bool
}

// fataler is what scriptCheck needs of *testing.T and *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

func newScriptCheck(f fataler, s *bucket.RedisStore, c *redis.Client, key string, l bucket.Limit) *scriptCheck {
	f.Helper()
	tm, err := c.Time(context.Background()).Result()
	if err != nil {
		f.Fatalf("TIME: %v", err)
	}
	return &scriptCheck{s: s, c: c, key: key, l: l, ids: map[string]*idRecord{}, lastNow: tm.UnixMicro()}
}

// takes decides costs in order in one TakeBatch: on one server, consecutive
// plain takes go in one "takes" script call, on one clock reading; each must
// be what the model decides, in turn.
func (sc *scriptCheck) takes(f fataler, costs []float64) {
	f.Helper()
	reqs := make([]bucket.Request, len(costs))
	for i, c := range costs {
		reqs[i] = bucket.Request{Key: sc.key, Limit: sc.l, Cost: c}
	}
	got, errs := sc.s.TakeBatchRaw(context.Background(), reqs)
	for i := range reqs {
		if errs[i] != nil {
			f.Fatalf("batch take %d of %d %+v: %v", i+1, len(reqs), reqs[i], errs[i])
		}
		var want bucket.Decision
		sc.st, want = bucket.ModelDecide(sc.st, sc.exists, sc.l, costs[i], got[i].Now)
		sc.exists, sc.hash = true, false
		if !sameDecision(got[i], want) {
			f.Fatalf("batch take %d of %d %+v:\n script %s\n model  %s", i+1, len(reqs), reqs[i], fmtDecision(got[i]), fmtDecision(want))
		}
		if got[i].Now != got[0].Now {
			f.Fatalf("batch take %d read the clock at %d, take 1 at %d: one script call reads it once", i+1, got[i].Now, got[0].Now)
		}
		sc.lastNow = max(sc.lastNow, got[i].Now)
	}
	sc.checkState(f)
	sc.checkTTL(f, got[0].Now)
}

func (sc *scriptCheck) take(f fataler, cost float64, id string) { sc.takeHeld(f, cost, id, 0) }

// takeHeld is take, held for heldFor µs (0: not held; id must be "").
func (sc *scriptCheck) takeHeld(f fataler, cost float64, id string, heldFor int64) {
	f.Helper()
	req := bucket.Request{Key: sc.key, Limit: sc.l, Cost: cost, RequestID: id, HeldFor: heldFor}
	got, err := sc.s.TakeRaw(context.Background(), req)
	if err != nil {
		f.Fatalf("take %+v: %v", req, err)
	}
	var want bucket.Decision
	if rec := sc.ids[id]; rec != nil {
		want = rec.reply
		want.Replayed = true
	} else {
		sc.st, want = bucket.ModelDecideHeld(sc.st, sc.exists, sc.l, cost, heldFor, got.Now)
		sc.exists, sc.hash = true, false
		if id != "" {
			sc.ids[id] = &idRecord{reply: want}
		}
	}
	if !sameDecision(got, want) {
		f.Fatalf("take %+v:\n script %s\n model  %s", req, fmtDecision(got), fmtDecision(want))
	}
	if id != "" && !got.Replayed {
		sc.checkRecord(f, id, want)
	}
	sc.lastNow = max(sc.lastNow, got.Now)
	sc.checkState(f)
	if !got.Replayed {
		sc.checkTTL(f, got.Now)
	}
}

// checkRecord compares a request id's record with the model's decision, bit
// for bit. A fresh take's reply carries tokens only (the store derives the
// waits in Go); the record is where the script's own retry and reset
// arithmetic shows, and replays answer from it. Its format,
// "<allowed> <tokens> <retry s> <reset s> <now µs>", is also what agents of
// earlier versions write and read.
func (sc *scriptCheck) checkRecord(f fataler, id string, want bucket.Decision) {
	f.Helper()
	rkey := bucket.RequestIDKey(sc.key, id)
	rec, err := sc.c.HGet(context.Background(), rkey, "decision").Result()
	if err != nil {
		f.Fatalf("HGET %s decision: %v", rkey, err)
	}
	got, err := parseRecord(rec)
	if err != nil || !sameDecision(got, want) {
		f.Fatalf("record %s = %q (%v):\n script %s\n model  %s", rkey, rec, err, fmtDecision(got), fmtDecision(want))
	}
}

// parseRecord reads a request id's recorded decision.
func parseRecord(rec string) (bucket.Decision, error) {
	var d bucket.Decision
	f := strings.Split(rec, " ")
	if len(f) != 5 || (f[0] != "0" && f[0] != "1") {
		return d, fmt.Errorf("not <allowed> <tokens> <retry> <reset> <now>")
	}
	var errs [4]error
	d.Allowed = f[0] == "1"
	d.Tokens, errs[0] = strconv.ParseFloat(f[1], 64)
	d.Retry, errs[1] = strconv.ParseFloat(f[2], 64)
	d.Reset, errs[2] = strconv.ParseFloat(f[3], 64)
	d.Now, errs[3] = strconv.ParseInt(f[4], 10, 64)
	return d, errors.Join(errs[:]...)
}

func (sc *scriptCheck) refund(f fataler, cost float64, id string) {
	f.Helper()
	req := bucket.Request{Key: sc.key, Limit: sc.l, Cost: cost, RequestID: id}
	got, now, err := sc.s.RefundRaw(context.Background(), req)
	if err != nil {
		f.Fatalf("refund %+v: %v", req, err)
	}
	want := true
	if id != "" {
		rec := sc.ids[id]
		if rec == nil || !rec.reply.Allowed || rec.refunded {
			want = false
		} else {
			rec.refunded = true
		}
	}
	wrote := want && sc.exists
	if wrote {
		sc.st, sc.hash = bucket.Refund(sc.st, sc.l, cost, now), false
	}
	if got != want {
		f.Fatalf("refund %+v: refunded=%v, model says %v", req, got, want)
	}
	sc.lastNow = max(sc.lastNow, now)
	sc.checkState(f)
	if wrote {
		sc.checkTTL(f, now)
	}
}

// inject writes a state directly, as another writer (or a clock that has
// since stepped back) would have left it: as the script stores a bucket,
// or, with hash, as earlier versions did (a hash of decimal strings),
// which the script must read as the same state and rewrite in its own form.
func (sc *scriptCheck) inject(f fataler, st bucket.State, hash bool) {
	f.Helper()
	if err := writeBucket(context.Background(), sc.c, sc.key, st, hash); err != nil {
		f.Fatalf("inject %+v (hash %v): %v", st, hash, err)
	}
	sc.st, sc.exists, sc.hash = st, true, hash
}

// writeBucket stores st at key as the script does (packBucket, no TTL) or,
// with hash, as earlier versions did (a hash of decimal strings), replacing
// whatever key held.
func writeBucket(ctx context.Context, c *redis.Client, key string, st bucket.State, hash bool) error {
	if !hash {
		return c.Set(ctx, key, packBucket(st), 0).Err()
	}
	if err := c.Del(ctx, key).Err(); err != nil {
		return err
	}
	return c.HSet(ctx, key, "tokens", strconv.FormatFloat(st.Tokens, 'g', -1, 64), "last", st.Last).Err()
}

// packBucket is a bucket as the script stores it: tokens, last (µs) and
// exp (µs, 0 here: no TTL known), three little-endian float64, and held
// and held until when it holds something.
func packBucket(st bucket.State) string {
	b := binary.LittleEndian.AppendUint64(nil, math.Float64bits(st.Tokens))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(st.Last)))
	b = binary.LittleEndian.AppendUint64(b, 0)
	if st.Held != 0 {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(st.Held))
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(st.HeldUntil)))
	}
	return string(b)
}

// readBucket reads the bucket stored at key (see packBucket); ok is false
// when there is none.
func readBucket(ctx context.Context, c *redis.Client, key string) (st bucket.State, ok bool, err error) {
	st, _, ok, hash, err := readAnyBucket(ctx, c, key)
	if err == nil && hash {
		err = fmt.Errorf("%s is a hash (the form of earlier versions), not the script's", key)
	}
	return st, ok, err
}

// readAnyBucket reads the bucket stored at key in the script's form, with
// its exp (µs before which its TTL cannot end, 0 for none), or, as hash
// reports, as earlier versions stored it.
func readAnyBucket(ctx context.Context, c *redis.Client, key string) (st bucket.State, exp float64, ok, hash bool, err error) {
	typ, err := c.Type(ctx, key).Result()
	if err != nil {
		return st, 0, false, false, fmt.Errorf("TYPE %s: %w", key, err)
	}
	switch typ {
	case "none":
		return st, 0, false, false, nil
	case "hash":
		h, err := c.HGetAll(ctx, key).Result()
		if err != nil {
			return st, 0, false, true, fmt.Errorf("HGETALL %s: %w", key, err)
		}
		var err1, err2 error
		st.Tokens, err1 = strconv.ParseFloat(h["tokens"], 64)
		st.Last, err2 = strconv.ParseInt(h["last"], 10, 64)
		if err := errors.Join(err1, err2); err != nil || len(h) != 2 {
			return st, 0, false, true, fmt.Errorf("HGETALL %s = %v: %v", key, h, err)
		}
		return st, 0, true, true, nil
	}
	v, err := c.Get(ctx, key).Result()
	if err != nil {
		return st, 0, false, false, fmt.Errorf("GET %s (a %s): %w", key, typ, err)
	}
	if len(v) != 24 && len(v) != 40 {
		return st, 0, false, false, fmt.Errorf("GET %s = %q: %d bytes, want 24 or 40", key, v, len(v))
	}
	if len(v) == 40 {
		st.Held = math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[24:])))
		hu := math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[32:])))
		if hu != math.Trunc(hu) || !(st.Held > 0) {
			return st, 0, false, false, fmt.Errorf("GET %s: held %v until %v: want > 0 until whole microseconds", key, st.Held, hu)
		}
		st.HeldUntil = int64(hu)
	}
	last := math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[8:])))
	if last != math.Trunc(last) {
		return st, 0, false, false, fmt.Errorf("GET %s: last %v is not whole microseconds", key, last)
	}
	st.Tokens, st.Last = math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[:8]))), int64(last)
	exp = math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[16:])))
	return st, exp, true, false, nil
}

func (sc *scriptCheck) drop(f fataler) {
	f.Helper()
	if err := sc.c.Del(context.Background(), sc.key).Err(); err != nil {
		f.Fatalf("DEL: %v", err)
	}
	sc.st, sc.exists, sc.hash = bucket.State{}, false, false
}

// checkState compares the stored bucket with the model's state, bit for
// bit.
func (sc *scriptCheck) checkState(f fataler) {
	f.Helper()
	st, _, ok, hash, err := readAnyBucket(context.Background(), sc.c, sc.key)
	if err != nil {
		f.Fatalf("stored bucket: %v", err)
	}
	if ok != sc.exists {
		f.Fatalf("stored bucket %s: exists=%v, model says %v", sc.key, ok, sc.exists)
	}
	if ok && hash != sc.hash {
		f.Fatalf("stored bucket %s: a hash=%v, want %v (every write stores the script's form)", sc.key, hash, sc.hash)
	}
	if ok && (math.Float64bits(st.Tokens) != math.Float64bits(sc.st.Tokens) || st.Last != sc.st.Last ||
		math.Float64bits(st.Held) != math.Float64bits(sc.st.Held) || st.HeldUntil != sc.st.HeldUntil) {
		f.Fatalf("stored tokens=%v (%x) last=%d held=%v until %d, model %v (%x) %d held=%v until %d", st.Tokens, math.Float64bits(st.Tokens), st.Last,
			st.Held, st.HeldUntil, sc.st.Tokens, math.Float64bits(sc.st.Tokens), sc.st.Last, sc.st.Held, sc.st.HeldUntil)
	}
}

// checkTTL checks the expiry of the bucket just written at server time now
// (the script's): its recorded exp, exactly, is no earlier than the model's
// expiry (now + expiresAfter) and no later than twice as far; the key's own
// TTL, read between two TIME readings, cannot end before exp (up to the
// millisecond Redis counts in), nor after twice the model's lifetime (up
// to a few ms). A
// bucket the model keeps forever has neither.
func (sc *scriptCheck) checkTTL(f fataler, now int64) {
	f.Helper()
	ctx := context.Background()
	_, exp, _, _, err := readAnyBucket(ctx, sc.c, sc.key)
	if err != nil {
		f.Fatalf("stored bucket: %v", err)
	}
	t0, err1 := sc.c.Time(ctx).Result()
	pttl, err2 := sc.c.PTTL(ctx, sc.key).Result()
	t1, err3 := sc.c.Time(ctx).Result()
	if err := errors.Join(err1, err2, err3); err != nil {
		f.Fatalf("TIME, PTTL, TIME: %v", err)
	}
	life := bucket.ExpiresAfter(sc.st, sc.l, now)
	if life == 0 {
		if exp != 0 || pttl != -1 {
			f.Fatalf("bucket kept forever by the model (limit %+v): exp %v, PTTL %v; want 0 and none", sc.l, exp, pttl)
		}
		return
	}
	need := float64(now + life)
	if exp < need || exp > float64(now+2*life+1000) {
		f.Fatalf("exp %.0f, want in [now+life %.0f, now+2*life %d] (now %d, life %d µs, limit %+v)", exp, need, now+2*life, now, life, sc.l)
	}
	if pttl < 0 {
		f.Fatalf("PTTL %v; want a TTL (life %d µs)", pttl, life)
	}
	// Redis reads its clock in whole ms between the two TIME readings.
	ms := pttl.Milliseconds()
	latest := (t1.UnixMicro()/1000 + ms + 1) * 1000
	earliest := (t0.UnixMicro()/1000 + ms) * 1000
	if float64(latest) < exp {
		f.Fatalf("the key's TTL ends by %d µs, before exp %.0f (PTTL %v)", latest, exp, pttl)
	}
	// The TTL is 2*life rounded up to a ms, counted from when SET ran,
	// after TIME: allow a few ms.
	if earliest > now+2*life+5000 {
		f.Fatalf("the key's TTL ends after %d µs, later than now + 2*life %d + 5ms (PTTL %v)", earliest, now+2*life, pttl)
	}
}

func sameDecision(a, b bucket.Decision) bool {
	return a.Allowed == b.Allowed && a.Now == b.Now && a.Replayed == b.Replayed &&
		math.Float64bits(a.Tokens) == math.Float64bits(b.Tokens) &&
		math.Float64bits(a.Retry) == math.Float64bits(b.Retry) &&
		math.Float64bits(a.Reset) == math.Float64bits(b.Reset)
}

func fmtDecision(d bucket.Decision) string {
	return fmt.Sprintf("allowed=%v tokens=%v (%x) retry=%v (%x) reset=%v (%x) now=%d replayed=%v",
		d.Allowed, d.Tokens, math.Float64bits(d.Tokens), d.Retry, math.Float64bits(d.Retry),
		d.Reset, math.Float64bits(d.Reset), d.Now, d.Replayed)
}

// TestScriptMatchesModel is the differential test: random sequences of
// takes, refunds (with and without request ids), injected states (clock
// offsets either way), deletions and limit changes, each checked exactly
// against the model. rapid logs the seed of a failing run
// (-rapid.seed=N replays it; -rapid.checks=N runs more).
func TestScriptMatchesModel(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t)
	s := bucket.NewRedisStore(openRedis(t, srv.Addr, testTimeout), bucket.RedisOptions{Timeout: testTimeout})
	var run atomic.Int64
	limit := func(rt *rapid.T) bucket.Limit {
		return bucket.Limit{
			Burst: rapid.OneOf(
				rapid.SampledFrom([]float64{1, 2.5, 3, 10, 100, 1e6, 1e12, 1e-3}),
				rapid.Float64Range(1e-6, bucket.MaxValue),
			).Draw(rt, "burst"),
			Rate: rapid.OneOf(
				rapid.SampledFrom([]float64{0, 1e-9, 0.1, 1, 3.7, 1000, 1e6, 1e12}),
				rapid.Float64Range(0, bucket.MaxValue),
			).Draw(rt, "rate"),
		}
	}
	rapid.Check(t, func(rt *rapid.T) {
		sc := newScriptCheck(rt, s, srv.Client(), bucket.Key("diff", strconv.FormatInt(run.Add(1), 10)), limit(rt))
		cost := func() float64 {
			b := sc.l.Burst
			return rapid.OneOf(
				rapid.SampledFrom([]float64{b, b / 2, b / 3, math.Min(1, b), math.Nextafter(b, 0)}),
				rapid.Float64Range(b*1e-9, b),
			).Draw(rt, "cost")
		}
		id := func() string { return rapid.SampledFrom([]string{"", "", "a", "b"}).Draw(rt, "id") }
		steps := rapid.IntRange(1, 30).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			switch op := rapid.IntRange(0, 10).Draw(rt, "op"); {
			case op == 10:
				costs := make([]float64, rapid.IntRange(2, 6).Draw(rt, "batch"))
				for j := range costs {
					costs[j] = cost()
				}
				sc.takes(rt, costs)
			case op <= 2:
				sc.take(rt, cost(), id())
			case op <= 4:
				// a held take, for as long as an RLQS assignment, or
				// for less than the sleeps below
				held := rapid.OneOf(rapid.Int64Range(1, 5000), rapid.Int64Range(1, 10_000_000)).Draw(rt, "held for µs")
				sc.takeHeld(rt, cost(), "", held)
			case op == 5:
				sc.refund(rt, cost(), id())
			case op == 6:
				frac := rapid.Float64Range(0, 1).Draw(rt, "fill")
				offset := rapid.OneOf(
					rapid.Int64Range(-20_000_000, 20_000_000),
					rapid.Int64Range(-1e13, 1e13),
				).Draw(rt, "offset µs")
				st := bucket.State{Tokens: frac * sc.l.Burst, Last: sc.lastNow + offset}
				hash := rapid.Bool().Draw(rt, "as a hash")
				if !hash && rapid.Bool().Draw(rt, "holding") {
					// tokens + held within burst, as the script keeps them;
					// the hold ends either side of now
					st.Tokens *= 0.5
					st.Held = rapid.Float64Range(1e-9, 0.5).Draw(rt, "held") * sc.l.Burst
					st.HeldUntil = sc.lastNow + rapid.Int64Range(-5_000_000, 5_000_000).Draw(rt, "held until µs")
				}
				sc.inject(rt, st, hash)
			case op == 7:
				time.Sleep(time.Duration(rapid.IntRange(0, 3000).Draw(rt, "sleep µs")) * time.Microsecond)
			case op == 8:
				sc.l = limit(rt) // the rule changed shape
			case op == 9:
				sc.drop(rt)
			}
		}
	})
}

// FuzzScript checks one script call against the model from an arbitrary
// stored state, on one redis-server for the whole run.
func FuzzScript(f *testing.F) {
	srv := harness.StartRedis(f)
	s := bucket.NewRedisStore(openRedis(f, srv.Addr, testTimeout), bucket.RedisOptions{Timeout: testTimeout})
	var run atomic.Int64
	f.Add(0.5, 10.0, 1.0, 0.25, int64(-3_000_000), uint8(0))
	f.Add(0.0, 1e12, 1e12, 1.0, int64(9_000_000_000), uint8(1))
	f.Add(1.0, 3.0, 0.0, 0.5, int64(0), uint8(2))
	f.Add(0.1, 1e-3, 1e-9, 1.0, int64(-1e13), uint8(3))
	f.Add(0.999, 7.3, 3.7, 0.999, int64(1), uint8(5))
	f.Add(0.25, 10.0, 2.0, 0.5, int64(-1_000_000), uint8(9))
	f.Fuzz(func(t *testing.T, fill, burst, rate, costFrac float64, offset int64, op uint8) {
		l := bucket.Limit{Burst: burst, Rate: rate}
		if l.Validate() != nil || math.IsNaN(fill) || math.IsInf(fill, 0) || math.IsNaN(costFrac) || math.IsInf(costFrac, 0) {
			return
		}
		cost := math.Abs(math.Mod(costFrac, 1)) * burst
		if cost == 0 {
			cost = burst
		}
		offset %= 1e13
		sc := newScriptCheck(t, s, srv.Client(), bucket.Key("fuzz", strconv.FormatInt(run.Add(1), 10)), l)
		if op&1 == 1 {
			sc.inject(t, bucket.State{Tokens: math.Abs(math.Mod(fill, 1)) * burst, Last: sc.lastNow + offset}, op&8 != 0)
		}
		id := ""
		if op&4 != 0 {
			id = "f"
		}
		if op&2 == 0 {
			sc.take(t, cost, id)
			sc.take(t, cost, id)
		} else {
			sc.refund(t, cost, id)
			sc.take(t, cost, id)
			sc.refund(t, cost, id)
		}
	})
}

// TestRedisReplaysRecordedDecision: a request id's record answers a replay
// with the decision as it was made, waits included, though the rule has
// another shape now; records are "<allowed> <tokens> <retry s> <reset s>
// <now µs>", the format agents of earlier versions write too.
func TestRedisReplaysRecordedDecision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := harness.StartRedis(t)
	s := bucket.NewRedisStore(openRedis(t, srv.Addr, testTimeout), bucket.RedisOptions{Timeout: testTimeout})
	k := bucket.Key("replay", "s")
	if err := srv.Client().HSet(ctx, bucket.RequestIDKey(k, "old"), "decision", "0 0.5 123.25 7 1700000000000001").Err(); err != nil {
		t.Fatal(err)
	}
	got, err := s.TakeRaw(ctx, bucket.Request{Key: k, Limit: bucket.Limit{Burst: 100, Rate: 1}, Cost: 1, RequestID: "old"})
	want := bucket.Decision{Tokens: 0.5, Retry: 123.25, Reset: 7, Now: 1700000000000001, Replayed: true}
	if err != nil || !sameDecision(got, want) {
		t.Fatalf("replay of a recorded denial = %s, %v; want %s", fmtDecision(got), err, fmtDecision(want))
	}
	if n, err := srv.Client().Exists(ctx, k).Result(); err != nil || n != 0 {
		t.Errorf("EXISTS %s = %d, %v after a replay; want no bucket (nothing charged)", k, n, err)
	}
}

// TestRedisClockBackwards: a bucket whose last is ahead of the server's
// clock (written before the clock stepped back) refills nothing and keeps
// its last, whether the script wrote it or an earlier version did, as a
// hash, which the take rewrites in the script's form.
func TestRedisClockBackwards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := harness.StartRedis(t)
	s := bucket.NewRedisStore(openRedis(t, srv.Addr, testTimeout), bucket.RedisOptions{Timeout: testTimeout})
	c := srv.Client()
	for _, hash := range []bool{false, true} {
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		ahead := tm.UnixMicro() + 10_000_000 // last written by a clock 10s ahead
		k := bucket.Key("clock", strconv.FormatBool(hash))
		l := bucket.Limit{Burst: 10, Rate: 1000}
		if err := writeBucket(ctx, c, k, bucket.State{Tokens: 3, Last: ahead}, hash); err != nil {
			t.Fatal(err)
		}
		res := mustTake(t, s, bucket.Request{Key: k, Limit: l, Cost: 1})
		if !res.Allowed || res.Remaining != 2 || res.Now >= ahead {
			t.Fatalf("hash %v: take with last 10s ahead = %+v; want 2 left (no refill) at a now before %d", hash, res, ahead)
		}
		if st, ok, err := readBucket(ctx, c, k); err != nil || !ok || st.Last != ahead || st.Tokens != 2 {
			t.Errorf("hash %v: bucket = %+v (%v), %v; want 2 tokens, last kept at %d", hash, st, ok, err, ahead)
		}
		// The TTL counts from last, which is ahead: time to full (10ms) + 10s.
		if pttl, err := c.PTTL(ctx, k).Result(); err != nil || pttl < 10*time.Second {
			t.Errorf("hash %v: PTTL = %v, %v; want >= 10s (time to full counted from a last 10s ahead)", hash, pttl, err)
		}
	}
}

// TestRedisForeignValue: a key that holds something other than a bucket
// fails the decision with a clear error and is left as it was.
func TestRedisForeignValue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := harness.StartRedis(t)
	s := bucket.NewRedisStore(openRedis(t, srv.Addr, testTimeout), bucket.RedisOptions{Timeout: testTimeout})
	c := srv.Client()
	l := bucket.Limit{Burst: 10, Rate: 1}
	for _, fv := range foreignValues {
		k := bucket.Key("foreign", fv.name)
		before := fv.plant(t, c, k)
		_, err := s.Take(ctx, bucket.Request{Key: k, Limit: l, Cost: 1})
		if err == nil || !strings.Contains(err.Error(), fv.want) || errors.Is(err, bucket.ErrUnavailable) {
			t.Errorf("%s: take = %v; want an error saying %q, not ErrUnavailable", fv.name, err, fv.want)
		}
		if dumpKey(t, c, k) != before {
			t.Errorf("%s: key changed by a failed take", fv.name)
		}
	}
}

// foreign is a value another program might have left at a bucket's key,
// and what the error of a decision on it must say.
type foreign struct {
	name, want string
	set        func(c *redis.Client, k string) error
}

var foreignValues = []foreign{
	{"short string", "holds 5 bytes", func(c *redis.Client, k string) error { return c.Set(context.Background(), k, "hello", 0).Err() }},
	{"list", "WRONGTYPE", func(c *redis.Client, k string) error { return c.RPush(context.Background(), k, "x").Err() }},
}

// plant stores the value at k and returns k's DUMP, to compare with later.
func (fv foreign) plant(t *testing.T, c *redis.Client, k string) string {
	t.Helper()
	if err := fv.set(c, k); err != nil {
		t.Fatal(err)
	}
	return dumpKey(t, c, k)
}

func dumpKey(t *testing.T, c *redis.Client, k string) string {
	t.Helper()
	v, err := c.Dump(context.Background(), k).Result()
	if err != nil {
		t.Fatalf("DUMP %s: %v", k, err)
	}
	return v
}

// TestRedisTakesForeignValue: in one "takes" call, a key holding something
// other than a bucket fails its own decision only (with the error a lone
// take gets) and is left as it was; the decisions around it are made.
func TestRedisTakesForeignValue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := harness.StartRedis(t)
	c := srv.Client()
	s := bucket.NewRedisStore(openRedis(t, srv.Addr, testTimeout), bucket.RedisOptions{Timeout: testTimeout})
	l := bucket.Limit{Burst: 10, Rate: 0}
	good := bucket.Key(t.Name(), "good")
	before := map[string]string{}
	var bad []string // foreignValues' keys, in turn
	for _, fv := range foreignValues {
		k := bucket.Key(t.Name(), fv.name)
		before[k] = fv.plant(t, c, k)
		bad = append(bad, k)
	}
	mustTake(t, s, bucket.Request{Key: bucket.Key(t.Name(), "warm"), Limit: l, Cost: 1})
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	keys := []string{good, bad[0], good, bad[1], good}
	reqs := make([]bucket.Request, len(keys))
	for i, k := range keys {
		reqs[i] = bucket.Request{Key: k, Limit: l, Cost: 1}
	}
	out := make([]bucket.Outcome, len(reqs))
	s.TakeBatch(ctx, reqs, out)
	stats, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if n := scriptCalls(t, stats); n != 1 {
		t.Fatalf("%d script calls for one batch; want 1 (a takes call)", n)
	}
	wantErr := map[int]string{1: foreignValues[0].want, 3: foreignValues[1].want}
	left := 9.0
	for i, o := range out {
		if want, ok := wantErr[i]; ok {
			if o.Err == nil || !strings.Contains(o.Err.Error(), want) || errors.Is(o.Err, bucket.ErrUnavailable) {
				t.Errorf("decision %d (%s) = %+v, %v; want an error saying %q, not ErrUnavailable", i, keys[i], o.Result, o.Err, want)
			}
			continue
		}
		if o.Err != nil || !o.Result.Allowed || o.Result.Remaining != left {
			t.Errorf("decision %d (%s) = %+v, %v; want admitted, %v left", i, keys[i], o.Result, o.Err, left)
		}
		left--
	}
	for k, v := range before {
		if dumpKey(t, c, k) != v {
			t.Errorf("%s changed by the batch", k)
		}
	}
}

// TestScriptRefusesUnknownOperation: the script, called directly with an
// operation it does not know, answers an error naming it and writes
// nothing (no bucket appears).
func TestScriptRefusesUnknownOperation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := harness.StartRedis(t)
	c := srv.Client()
	k := bucket.Key("op", "s")
	for _, op := range []string{"tak", "TAKE", ""} {
		err := c.Eval(ctx, bucket.ScriptSource, []string{k}, op, "10", "1", "1", "2000").Err()
		if err == nil || !strings.Contains(err.Error(), "unknown operation") {
			t.Errorf("op %q: %v; want an unknown operation error", op, err)
		}
	}
	if n, err := c.Exists(ctx, k).Result(); err != nil || n != 0 {
		t.Errorf("EXISTS %s = %d, %v after refused calls; want no bucket", k, n, err)
	}
}

func TestRedisExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := harness.StartRedis(t)
	const ridTTL = 90 * time.Second
	s := bucket.NewRedisStore(openRedis(t, srv.Addr, testTimeout), bucket.RedisOptions{Timeout: testTimeout, RequestIDTTL: ridTTL})
	c := srv.Client()
	pttl := func(key string) time.Duration {
		t.Helper()
		d, err := c.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	k := bucket.Key("expiry", "s")
	l := bucket.Limit{Burst: 10, Rate: 4}
	mustTake(t, s, bucket.Request{Key: k, Limit: l, Cost: 10, RequestID: "id"})
	ttf := l.TimeToFull()
	// A new key gets twice its least lifetime (time to full plus margin),
	// so that the decisions that follow within it keep that TTL.
	life := ttf + bucket.ExpiryMargin
	first := pttl(k)
	if first < 2*life-time.Second || first > 2*life+time.Millisecond {
		t.Errorf("bucket PTTL = %v; want 2 x (time to full %v + margin %v)", first, ttf, bucket.ExpiryMargin)
	}
	mustTake(t, s, bucket.Request{Key: k, Limit: l, Cost: 1})
	if got := pttl(k); got > first || got < life {
		t.Errorf("PTTL after a second take = %v; want the first one's (%v) kept, and >= %v", got, first, life)
	}
	if got := pttl(bucket.RequestIDKey(k, "id")); got <= ridTTL-10*time.Second || got > ridTTL {
		t.Errorf("request id PTTL = %v; want about %v", got, ridTTL)
	}
	// The rule becomes a fixed allowance: the bucket is kept for good.
	mustTake(t, s, bucket.Request{Key: k, Limit: bucket.Limit{Burst: 10, Rate: 0}, Cost: 1})
	if got := pttl(k); got != -1 {
		t.Errorf("rate-0 bucket PTTL = %v; want none (-1ms)", got)
	}
	// A refill longer than 2^50 µs is kept for good too.
	slow := bucket.Key("expiry", "slow")
	mustTake(t, s, bucket.Request{Key: slow, Limit: bucket.Limit{Burst: 1e12, Rate: 1e-3}, Cost: 1})
	if got := pttl(slow); got != -1 {
		t.Errorf("1e15 s refill PTTL = %v; want none (-1ms)", got)
	}
	// A refund refreshes the TTL by the same rule.
	mustRefund(t, s, bucket.Request{Key: k, Limit: l, Cost: 1})
	if got := pttl(k); got < ttf {
		t.Errorf("PTTL after refund = %v; want >= %v", got, ttf)
	}
}

func TestRedisScriptFlush(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := harness.StartRedis(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	s := bucket.NewRedisStore(openRedis(t, srv.Addr, testTimeout), bucket.RedisOptions{Timeout: testTimeout, Logger: log})
	c := srv.Client()
	m := newModel(bucket.Limit{Burst: 10, Rate: 0})
	k := bucket.Key("flush", "s")
	loaded := func() bool {
		ok, err := c.ScriptExists(ctx, bucket.ScriptSHA).Result()
		if err != nil {
			t.Fatal(err)
		}
		return ok[0]
	}
	if loaded() {
		t.Fatal("script loaded before the first call")
	}
	m.check(t, mustTake(t, s, bucket.Request{Key: k, Limit: m.l, Cost: 1}), 1)
	if !loaded() {
		t.Fatal("script not cached after the first call")
	}
	flush := func() {
		t.Helper()
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	flush()
	m.check(t, mustTake(t, s, bucket.Request{Key: k, Limit: m.l, Cost: 1}), 1)
	flush()
	out := make([]bucket.Outcome, 3)
	s.TakeBatch(ctx, []bucket.Request{{Key: k, Limit: m.l, Cost: 1}, {Key: k, Limit: m.l, Cost: 2}, {Key: k, Limit: m.l, Cost: 1}}, out)
	for i, o := range out {
		if o.Err != nil {
			t.Fatalf("batch after SCRIPT FLUSH [%d]: %v", i, o.Err)
		}
		m.check(t, o.Result, []float64{1, 2, 1}[i])
	}
	flush()
	mustRefund(t, s, bucket.Request{Key: k, Limit: m.l, Cost: 5})
	m.refund(5, m.st.Last)
	m.check(t, mustTake(t, s, bucket.Request{Key: k, Limit: m.l, Cost: 1}), 1)
	if !loaded() {
		t.Error("script not cached again after the reloads")
	}
	if n := strings.Count(logs.String(), "NOSCRIPT"); n != 1 {
		t.Errorf("logged the reload %d times, want once per minute:\n%s", n, logs.String())
	}
}

// TestCheckVersion: a Redis new enough for the script (the harness's,
// >= 6.0) draws no warning (a Cluster's masters: TestRedisStoreCluster).
func TestCheckVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := harness.StartRedis(t)
	if w, err := bucket.CheckVersion(ctx, openRedis(t, srv.Addr, testTimeout)); err != nil || w != "" {
		t.Errorf("CheckVersion(%s) = %q, %v; want no warning", srv.Addr, w, err)
	}
}

func TestCheckEviction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		policy string
		warn   string // substring; "" means no warning
	}{
		{"noeviction", ""},
		{"allkeys-lru", "allkeys-lru: under memory pressure Redis may evict buckets"},
		{"volatile-ttl", "Buckets with rate 0 have no TTL and are safe"},
	}
	for _, tt := range tests {
		t.Run(tt.policy, func(t *testing.T) {
			t.Parallel()
			srv := harness.StartRedis(t, harness.WithConfig("maxmemory-policy "+tt.policy))
			p, w, err := bucket.CheckEviction(ctx, openRedis(t, srv.Addr, testTimeout))
			if err != nil || p != tt.policy || (tt.warn == "") != (w == "") || !strings.Contains(w, tt.warn) {
				t.Errorf("CheckEviction = %q, %q, %v; want %q with a warning containing %q", p, w, err, tt.policy, tt.warn)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		srv := harness.StartRedis(t)
		c := openRedis(t, srv.Addr, time.Second)
		srv.Stop()
		if _, _, err := bucket.CheckEviction(ctx, c); err == nil {
			t.Error("CheckEviction of a stopped server: no error")
		}
	})
}

// TestRedisUnavailable checks that every failure to reach Redis, or to have
// it apply a decision now, wraps ErrUnavailable, and that other errors do
// not.
func TestRedisUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	req := func(t *testing.T) bucket.Request {
		return bucket.Request{Key: bucket.Key(t.Name(), "s"), Limit: bucket.Limit{Burst: 5, Rate: 1}, Cost: 1}
	}
	checkAll := func(t *testing.T, s *bucket.RedisStore, code string) {
		t.Helper()
		r := req(t)
		_, err := s.Take(ctx, r)
		if !errors.Is(err, bucket.ErrUnavailable) || !strings.Contains(err.Error(), code) {
			t.Errorf("Take error = %v; want ErrUnavailable mentioning %q", err, code)
		}
		out := make([]bucket.Outcome, 2)
		s.TakeBatch(ctx, []bucket.Request{r, r}, out)
		for i, o := range out {
			if !errors.Is(o.Err, bucket.ErrUnavailable) {
				t.Errorf("TakeBatch[%d] error = %v; want ErrUnavailable", i, o.Err)
			}
		}
		if err := s.Refund(ctx, r); !errors.Is(err, bucket.ErrUnavailable) {
			t.Errorf("Refund error = %v; want ErrUnavailable", err)
		}
	}

	t.Run("stopped", func(t *testing.T) {
		t.Parallel()
		srv := harness.StartRedis(t)
		s := bucket.NewRedisStore(openRedis(t, srv.Addr, time.Second), bucket.RedisOptions{Timeout: time.Second})
		mustTake(t, s, req(t)) // pooled connections exist
		srv.Stop()
		checkAll(t, s, "")
		if err := s.Ping(ctx); !errors.Is(err, bucket.ErrUnavailable) {
			t.Errorf("Ping error = %v; want ErrUnavailable", err)
		}
	})
	t.Run("paused", func(t *testing.T) {
		t.Parallel()
		srv := harness.StartRedis(t)
		s := bucket.NewRedisStore(openRedis(t, srv.Addr, 300*time.Millisecond), bucket.RedisOptions{Timeout: 300 * time.Millisecond})
		mustTake(t, s, req(t))
		srv.Pause()
		checkAll(t, s, "")
		srv.Resume()
	})
	// The server refuses writes: Take and TakeBatch fail, and so does Refund
	// to the bucket that a first Take created before the server turned.
	t.Run("replica answers READONLY", func(t *testing.T) {
		t.Parallel()
		// Redis waits 5s by default before a diskless sync, for more replicas
		// to join it: that wait alone could use up WAIT's time on a busy
		// machine.
		primary := harness.StartRedis(t, harness.WithConfig("repl-diskless-sync-delay 0"))
		replica := harness.StartRedis(t, harness.WithReplicaOf(primary.Addr))
		mustTake(t, bucket.NewRedisStore(openRedis(t, primary.Addr, time.Second), bucket.RedisOptions{Timeout: time.Second}), req(t))
		if n, err := primary.Client().Do(ctx, "WAIT", 1, 10000).Int(); err != nil || n != 1 {
			t.Fatalf("WAIT 1 = %d, %v", n, err)
		}
		s := bucket.NewRedisStore(openRedis(t, replica.Addr, time.Second), bucket.RedisOptions{Timeout: time.Second})
		checkAll(t, s, "READONLY")
	})
	for _, tt := range []struct{ code, param, value string }{
		{"NOREPLICAS", "min-replicas-to-write", "1"},
		{"OOM", "maxmemory", "1"},
	} {
		t.Run(tt.code, func(t *testing.T) {
			t.Parallel()
			srv := harness.StartRedis(t)
			s := bucket.NewRedisStore(openRedis(t, srv.Addr, time.Second), bucket.RedisOptions{Timeout: time.Second})
			mustTake(t, s, req(t))
			if err := srv.Client().ConfigSet(ctx, tt.param, tt.value).Err(); err != nil {
				t.Fatal(err)
			}
			checkAll(t, s, tt.code)
		})
	}
	t.Run("other errors are not unavailability", func(t *testing.T) {
		t.Parallel()
		srv := harness.StartRedis(t)
		s := bucket.NewRedisStore(openRedis(t, srv.Addr, testTimeout), bucket.RedisOptions{Timeout: testTimeout})
		r := req(t)
		if err := srv.Client().RPush(ctx, r.Key, "not a bucket").Err(); err != nil {
			t.Fatal(err)
		}
		_, err := s.Take(ctx, r)
		if err == nil || errors.Is(err, bucket.ErrUnavailable) || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Errorf("Take on a list key: error %v; want WRONGTYPE, not ErrUnavailable", err)
		}
	})
}

func TestRedisSentinelFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ss := harness.StartSentinel(t, "ration")
	spec := "redis-sentinel://" + strings.Join(ss.SentinelAddrs, ",") + "/" + ss.MasterName
	s := bucket.NewRedisStore(openRedis(t, spec, time.Second), bucket.RedisOptions{Timeout: time.Second})
	k := bucket.Key("failover", "s")
	req := bucket.Request{Key: k, Limit: bucket.Limit{Burst: 100, Rate: 0}, Cost: 1}
	if res := mustTake(t, s, req); res.Remaining != 99 {
		t.Fatalf("first take = %+v, want 99 left", res)
	}
	// The replica has the write before the primary dies.
	if n, err := ss.Primary.Client().Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}
	ss.Primary.Kill()
	newAddr, err := ss.WaitForFailover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if newAddr != ss.Replica.Addr {
		t.Fatalf("sentinels promoted %s, want the replica %s", newAddr, ss.Replica.Addr)
	}
	// The same store, no restart: it decides against the new primary once
	// its client has followed the switch.
	var res bucket.Result
	for attempt := 1; ; attempt++ {
		res, err = s.Take(ctx, req)
		if err == nil {
			t.Logf("decided on the new primary after %d attempts", attempt)
			break
		}
		if !errors.Is(err, bucket.ErrUnavailable) {
			t.Fatalf("take during failover: %v (want ErrUnavailable while it lasts)", err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no decision on the new primary: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if !res.Allowed || res.Remaining != 98 {
		t.Errorf("take on the new primary = %+v, want 98 left (the replicated balance)", res)
	}
	if st, ok, err := readBucket(ctx, ss.Replica.Client(), k); err != nil || !ok || st.Tokens != 98 {
		t.Errorf("new primary holds %+v (%v, %v), want 98 tokens", st, ok, err)
	}
}

// TestTakeBatchScriptCalls: on one server, a batch's plain takes go up to
// 128 at a time in one script call, a request with an id goes alone in
// between (keeping the batch's order), and each answer is the decision of
// its own request: over a fixed allowance of 250, the first 250 of 300 takes
// of one key are admitted, Remaining counting down.
func TestTakeBatchScriptCalls(t *testing.T) {
	t.Parallel()
	srv := harness.StartRedis(t)
	s := bucket.NewRedisStore(openRedis(t, srv.Addr, 5*time.Second), bucket.RedisOptions{Timeout: 5 * time.Second})
	ctx := context.Background()
	l := bucket.Limit{Burst: 250, Rate: 0}
	mustTake(t, s, bucket.Request{Key: bucket.Key(t.Name(), "load"), Limit: l, Cost: 1}) // the script is cached
	for _, tt := range []struct {
		name  string
		idAt  int // a request with an id at this index; -1: none
		calls int
	}{
		{"plain", -1, 3},      // 128 + 128 + 44
		{"id at 200", 200, 4}, // 128 + 72, the id, 99
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := srv.Client().ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			k := bucket.Key(t.Name(), "s")
			reqs := make([]bucket.Request, 300)
			for i := range reqs {
				reqs[i] = bucket.Request{Key: k, Limit: l, Cost: 1}
			}
			if tt.idAt >= 0 {
				reqs[tt.idAt].RequestID = "id"
			}
			out := make([]bucket.Outcome, len(reqs))
			s.TakeBatch(ctx, reqs, out)
			for i, o := range out {
				want := bucket.Result{Allowed: i < 250, Remaining: max(0, 249-float64(i)), Now: o.Result.Now}
				if o.Err != nil || o.Result != want {
					t.Fatalf("take %d = %+v, %v; want %+v", i, o.Result, o.Err, want)
				}
			}
			stats, err := srv.Client().Info(ctx, "commandstats").Result()
			if err != nil {
				t.Fatal(err)
			}
			if n := scriptCalls(t, stats); n != tt.calls {
				t.Errorf("%d script calls; want %d", n, tt.calls)
			}
		})
	}
}

// scriptCalls counts EVALSHA and EVAL calls in INFO commandstats.
func scriptCalls(t *testing.T, stats string) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(stats, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
				c, err := strconv.Atoi(calls)
				if err != nil {
					t.Fatalf("commandstats %q: %v", line, err)
				}
				n += c
			}
		}
	}
	return n
}
