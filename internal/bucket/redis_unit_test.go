package bucket

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestParseRedisSpec(t *testing.T) {
	tests := []struct {
		spec string
		want redisSpec
	}{
		{"localhost:6379", redisSpec{kind: "single", addrs: []string{"localhost:6379"}}},
		{"[::1]:6379", redisSpec{kind: "single", addrs: []string{"[::1]:6379"}}},
		{"redis://10.0.0.1:6380", redisSpec{kind: "single", addrs: []string{"10.0.0.1:6380"}}},
		{"redis://h:1/3", redisSpec{kind: "single", addrs: []string{"h:1"}, db: 3}},
		{"redis://:s3cret@h:1/", redisSpec{kind: "single", addrs: []string{"h:1"}, password: "s3cret"}},
		{"redis://app:p%40ss%3Aw@h:1", redisSpec{kind: "single", addrs: []string{"h:1"}, user: "app", password: "p@ss:w"}},
		{"redis-sentinel://s1:26379,s2:26379,s3:26379/mymaster",
			redisSpec{kind: "sentinel", addrs: []string{"s1:26379", "s2:26379", "s3:26379"}, master: "mymaster"}},
		{"redis-sentinel://u:p@s1:26379/m", redisSpec{kind: "sentinel", addrs: []string{"s1:26379"}, master: "m", user: "u", password: "p"}},
		{"redis-cluster://n1:7000,n2:7001", redisSpec{kind: "cluster", addrs: []string{"n1:7000", "n2:7001"}}},
		{"redis-cluster://n1:7000/", redisSpec{kind: "cluster", addrs: []string{"n1:7000"}}},
	}
	for _, tt := range tests {
		got, err := parseRedisSpec(tt.spec)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseRedisSpec(%q) = %+v, %v; want %+v", tt.spec, got, err, tt.want)
		}
	}
}

func TestOpenRedisErrors(t *testing.T) {
	tests := []struct {
		spec string
		want string // in the error
	}{
		{"", `"" is not host:port`},
		{"localhost", `"localhost" is not host:port`},
		{"localhost:http", `port "http" in "localhost:http"`},
		{"h:0", `port "0"`},
		{"h:70000", `port "70000"`},
		{":6379", `":6379" has no host`},
		{"redisx://h:1", `scheme "redisx" is not supported`},
		{"rediss-cluster://n:1?sentinel_password=x", "only for Sentinel forms"},
		{"redis-sentinel://s:1/m?foo=1", `query parameter "foo" is not supported`},
		{"redis-sentinel://s:1/m?sentinel_password=a&sentinel_password=b", "given 2 times"},
		{"redis://h:1#x", "fragments"},
		{"redis://", "no host:port after the scheme"},
		{"redis://h:1,h:2", "redis:// takes one host:port, got 2"},
		{"redis://h:1/x", `database "x" after '/'`},
		{"redis://h:1/-1", `database "-1"`},
		{"redis://h:1?db=2", "query parameters"},
		{"redis://u:p%zz@h:1", "password is not valid percent-encoding"},
		{"redis-sentinel://s:1", "missing master name"},
		{"redis-sentinel://s:1/", "missing master name"},
		{"redis-sentinel://s:1,bad/m", `"bad" is not host:port`},
		{"redis-sentinel://s:1/m/2", `master name "m/2"`},
		{"redis-cluster://n:1/2", "a cluster has only database 0"},
		{"redis-cluster://n:1,,n:2", `"" is not host:port`},
	}
	for _, tt := range tests {
		c, err := OpenRedis(tt.spec, time.Second)
		if err == nil {
			_ = c.Close()
			t.Errorf("OpenRedis(%q) succeeded; want an error containing %q", tt.spec, tt.want)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("OpenRedis(%q) error = %q; want it to contain %q", tt.spec, err, tt.want)
		}
	}
	if _, err := OpenRedis("h:1", 0); err == nil {
		t.Errorf("OpenRedis with timeout 0 succeeded")
	}
	// A server name no certificate can carry is a start-up error, not a
	// refusal at every handshake.
	for _, name := range []string{"redis.example:6379", "https://redis.example", "a b"} {
		if _, err := OpenRedisTLS("rediss://h:1", time.Second, RedisTLS{ServerName: name}); err == nil || !strings.Contains(err.Error(), "is not a host name or IP address") {
			t.Errorf("ServerName %q: %v, want refused", name, err)
		}
	}
	for _, name := range []string{"redis.example", "10.0.0.1", "::1"} {
		c, err := OpenRedisTLS("rediss://h:1", time.Second, RedisTLS{ServerName: name})
		if err != nil {
			t.Errorf("ServerName %q: %v, want accepted", name, err)
			continue
		}
		_ = c.Close()
	}
}

func TestOpenRedisNeverEchoesPassword(t *testing.T) {
	_, err := OpenRedis("redis://app:hunter2@h:1/x", time.Second)
	if err == nil || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "app") || !strings.Contains(err.Error(), "://xxxxx@h:1") {
		t.Errorf("error %q; want the user and password redacted", err)
	}
}

func TestOpenRedisClientKinds(t *testing.T) {
	tests := []struct {
		spec  string
		check func(redis.UniversalClient) string
	}{
		{"h:1", func(c redis.UniversalClient) string {
			o := c.(*redis.Client).Options()
			if o.Addr != "h:1" || o.ReadTimeout != 2*time.Second || o.DialTimeout != 2*time.Second ||
				o.WriteTimeout != 2*time.Second || o.PoolTimeout != 2*time.Second || !o.ContextTimeoutEnabled {
				return "single options not set from spec and timeout"
			}
			return ""
		}},
		{"redis://u:p@h:1/4", func(c redis.UniversalClient) string {
			o := c.(*redis.Client).Options()
			if o.Username != "u" || o.Password != "p" || o.DB != 4 {
				return "credentials or db not set"
			}
			return ""
		}},
		{"redis-cluster://a:1,b:2", func(c redis.UniversalClient) string {
			o := c.(*redis.ClusterClient).Options()
			if len(o.Addrs) != 2 || o.ReadOnly || o.RouteByLatency || o.RouteRandomly || !o.ContextTimeoutEnabled {
				return "cluster must route to masters only"
			}
			return ""
		}},
		{"redis-sentinel://u:p@a:1,b:2/m", func(c redis.UniversalClient) string {
			fc, ok := c.(*redis.Client)
			if !ok {
				return "sentinel spec must give a failover *redis.Client (primary only)"
			}
			o := fc.Options()
			if o.Username != "u" || o.Password != "p" || o.ReadTimeout != 2*time.Second || !o.ContextTimeoutEnabled {
				return "failover options not set from spec and timeout"
			}
			return ""
		}},
	}
	for _, tt := range tests {
		c, err := OpenRedis(tt.spec, 2*time.Second)
		if err != nil {
			t.Errorf("OpenRedis(%q): %v", tt.spec, err)
			continue
		}
		if msg := tt.check(c); msg != "" {
			t.Errorf("OpenRedis(%q): %s", tt.spec, msg)
		}
		_ = c.Close()
	}
}

// redisErr is a server error reply as go-redis types them.
type redisErr string

func (e redisErr) Error() string { return string(e) }
func (redisErr) RedisError()     {}

func TestUnavailable(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{redisErr("LOADING Redis is loading the dataset in memory"), true},
		{redisErr("READONLY You can't write against a read only replica."), true},
		{redisErr("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), true},
		{redisErr("CLUSTERDOWN The cluster is down"), true},
		{redisErr("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{redisErr("NOREPLICAS Not enough good replicas to write. script: 1, on @user_script:1."), true},
		{redisErr("ERR Error running script (call to f_1): @user_script:1: -NOREPLICAS Not enough good replicas to write."), true},
		{redisErr("OOM command not allowed when used memory > 'maxmemory'."), true},
		{redisErr("BUSY Redis is busy running a script."), true},
		{redisErr("ERR max number of clients reached"), true},
		{redisErr("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{redisErr("ERR user_script:1: Script attempted to access nonexistent global variable"), false},
		{redis.ErrPoolTimeout, true},
		{redis.ErrClosed, true},
		{context.DeadlineExceeded, true},
		{fmt.Errorf("wrapped: %w", context.Canceled), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, true},
		{errors.New("bucket: redis take: unexpected reply"), false},
	}
	for _, tt := range tests {
		if got := unavailable(tt.err); got != tt.want {
			t.Errorf("unavailable(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// packFloats is what struct.pack('<d...', ...) writes in the script.
func packFloats(vs ...float64) string {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return string(b)
}

// TestParseTakeReply checks both forms of the script's take reply. The
// binary form of a decision just made carries tokens only: the waits
// derived from them must be the model's own, bit for bit, whatever the
// limit and cost.
func TestParseTakeReply(t *testing.T) {
	limits := []Limit{{Burst: 10, Rate: 3}, {Burst: 1e12, Rate: 1e-9}, {Burst: 2.5, Rate: 0}, {Burst: 1e6, Rate: 1e6}, {Burst: 1e-3, Rate: 1e12}}
	const now = t0 + 123
	for _, l := range limits {
		for _, fill := range []float64{0, 1e-9, 0.3, 1.0 / 3, 0.5, 0.999, 1} {
			for _, costFrac := range []float64{1e-9, 0.1, 0.5, 1.0 / 7, 1} {
				s, cost := State{Tokens: fill * l.Burst, Last: now - 7}, costFrac*l.Burst
				_, want := take(s, true, l, cost, 0, now)
				allowed := "0"
				if want.allowed {
					allowed = "1"
				}
				for _, reply := range []string{
					allowed + packFloats(want.tokens, float64(now), 0),                                   // last is now
					allowed + packFloats(want.tokens, float64(now+5e6), 7e15) + packFloats(float64(now)), // last ahead
				} {
					got, err := parseStateReply(reply, l, cost)
					if err != nil || got.replayed || got.now != now || got.allowed != want.allowed ||
						math.Float64bits(got.tokens) != math.Float64bits(want.tokens) ||
						math.Float64bits(got.retry) != math.Float64bits(want.retry) ||
						math.Float64bits(got.reset) != math.Float64bits(want.reset) {
						t.Errorf("limit %+v cost %v: parse %q = %+v, %v; model %+v", l, cost, reply, got, err, want)
					}
				}
			}
		}
	}
	for _, bad := range []string{"", "1", "2" + packFloats(1, float64(now), 0), "1" + packFloats(1, float64(now)), "1" + packFloats(1, float64(now), 0) + "x",
		"1" + packFloats(1, 1.5, 0), "1" + packFloats(1, -1, 0), "1" + packFloats(1, math.NaN(), 0), "1" + packFloats(1, float64(now), 0, 1<<53),
		"1 1 " + strconv.FormatInt(now, 10)} {
		if r, err := parseStateReply(bad, Limit{Burst: 10, Rate: 1}, 1); err == nil {
			t.Errorf("parseStateReply(%q) = %+v; want an error", bad, r)
		}
	}

	// The text form (a request id's record) is taken as it is: it is the
	// decision as it was made, waits included, whatever the limit is now.
	got, err := parseTakeReply("0 0.5 123.25 7 1700000000000001 1")
	want := takeReply{decision: decision{tokens: 0.5, retry: 123.25, reset: 7}, now: 1700000000000001, replayed: true}
	if err != nil || got != want {
		t.Errorf("text form = %+v, %v; want %+v", got, err, want)
	}
	for _, bad := range []string{"", "1", "1 2", "1 2 3", "1 2 3 4", "1 2 3 4 5", "1 2 3 4 5 0 7", "2 1 5 1 1 0", "1 x 1 1 5 0", "1 1 1 1 5.5 0",
		"1 1 1 1 5 2", "x 1 1 1 5 0", "1 1 1 1 5 0 "} {
		if r, err := parseTakeReply(bad); err == nil {
			t.Errorf("parseTakeReply(%q) = %+v; want an error", bad, r)
		}
	}
}

// TestParseTakesReply: a "takes" reply answers each request in turn, with
// the waits derived as the take reply's are; a reply that does not read,
// or answers another number of decisions, fails every request, each
// exactly once.
func TestParseTakesReply(t *testing.T) {
	reqs := []Request{
		{Key: "a", Limit: Limit{Burst: 10, Rate: 3}, Cost: 1},
		{Key: "b", Limit: Limit{Burst: 2.5, Rate: 0}, Cost: 2},
		{Key: "a", Limit: Limit{Burst: 10, Rate: 3}, Cost: 4},
	}
	collect := func(reply string) ([]takeReply, []error) {
		got, errs := make([]takeReply, len(reqs)), make([]error, len(reqs))
		seen := make([]int, len(reqs))
		parseTakesReply(reply, reqs, func(j int, r takeReply, err error) {
			seen[j]++
			got[j], errs[j] = r, err
		})
		for j, n := range seen {
			if n != 1 {
				t.Fatalf("parseTakesReply(%q) answered request %d %d times; want once", reply, j, n)
			}
		}
		return got, errs
	}
	const now = 1700000000000001
	d := func(allowed string, tokens float64) string { return allowed + packFloats(tokens, now, now+2e6) }
	good := packFloats(now) + d("1", 9) + d("0", 0.5) + d("1", 5)
	got, errs := collect(good)
	want := []takeReply{
		{decision: decided(true, 9, reqs[0].Limit, 1), now: now},
		{decision: decided(false, 0.5, reqs[1].Limit, 2), now: now},
		{decision: decided(true, 5, reqs[2].Limit, 4), now: now},
	}
	for j := range reqs {
		if errs[j] != nil || got[j] != want[j] {
			t.Errorf("decision %d = %+v, %v; want %+v", j, got[j], errs[j], want[j])
		}
	}
	// A foreign value fails its own decision only.
	got, errs = collect(packFloats(now) + d("1", 9) + "e" + packFloats(5, 0, 0) + d("1", 5))
	if errs[0] != nil || got[0] != want[0] || errs[2] != nil || got[2] != want[2] {
		t.Errorf("decisions around a foreign value = %+v %v, %+v %v; want %+v, %+v", got[0], errs[0], got[2], errs[2], want[0], want[2])
	}
	if errs[1] == nil || !strings.Contains(errs[1].Error(), `key "b" holds 5 bytes`) {
		t.Errorf("foreign value's decision: error %v; want one naming key \"b\" and its 5 bytes", errs[1])
	}
	if _, errs = collect(packFloats(now) + d("1", 9) + d("0", 0.5) + "e" + packFloats(-1, 0, 0)); errs[2] == nil || !strings.Contains(errs[2].Error(), "WRONGTYPE") || errs[0] != nil {
		t.Errorf("another type: errors %v; want WRONGTYPE for the third decision only", errs)
	}
	for _, tt := range []struct {
		reply string
		from  int // the first request failed; every later one fails too
	}{
		{"", 0}, {packFloats(now), 0}, {good[:len(good)-25], 0}, {good + d("1", 2), 0}, {good + " ", 0},
		{packFloats(0.5) + good[8:], 0}, {packFloats(now) + d("2", 9) + d("0", 0.5) + d("1", 5), 0},
		{packFloats(now) + d("1", 9) + d("x", 0.5) + d("1", 5), 1}, {packFloats(now) + d("1", 9) + d("0", 0.5) + d("-", 5), 2},
	} {
		_, errs := collect(tt.reply)
		for j, err := range errs {
			if (err != nil) != (j >= tt.from) {
				t.Errorf("parseTakesReply(%q): request %d error = %v; want one from request %d on", tt.reply, j, err, tt.from)
			}
		}
	}
}

// TestScriptTTL: the TTL the store passes the script is the model's expiry
// for a bucket whose last is now, in whole milliseconds rounded up, or "0"
// (no expiry) where the model keeps the bucket forever.
func TestScriptTTL(t *testing.T) {
	for _, l := range []Limit{
		{Burst: 1e6, Rate: 1e6}, {Burst: 10, Rate: 4}, {Burst: 1, Rate: 3}, {Burst: 2.5, Rate: 0.1},
		{Burst: 10, Rate: 0}, {Burst: 1e12, Rate: 1e-3}, {Burst: 1e-3, Rate: 1e12}, {Burst: 7.3, Rate: 3.7},
	} {
		want := "0"
		if us := expiresAfter(State{Last: 1e15}, l, 1e15); us > 0 {
			want = strconv.FormatInt(int64(math.Ceil(float64(2*us)/1000)), 10)
		}
		if got := scriptTTL(l); got != want {
			t.Errorf("scriptTTL(%+v) = %s; want %s", l, got, want)
		}
	}
}

func TestVersionBefore(t *testing.T) {
	for _, tt := range []struct {
		v    string
		want bool
	}{
		{"5.0.14", true}, {"5", true}, {"4.0.9", true}, {"6.0", false}, {"6", false}, {"6.0.0", false},
		{"6.2.14", false}, {"7.0.15", false}, {"10.0.0", false}, {"6.0-rc1", false}, {"5.9.9", true},
	} {
		if got := versionBefore(tt.v, "6.0"); got != tt.want {
			t.Errorf("versionBefore(%q, 6.0) = %v; want %v", tt.v, got, tt.want)
		}
	}
}
