package bucket_test

import (
	"context"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/bucket"
	"github.com/ration-dev/ration/internal/harness"
)

// Warm loads both scripts on a server that holds none. After a flush (a
// failover to a replica that never ran them), the call that finds them
// gone sends the script again on the warm-up budget, not on the
// decision's: on a slow link the 9.6 kB script takes longer to send than
// a decision may wait, and that call still decides.
func TestWarmAndNoScriptRewarm(t *testing.T) {
	r := harness.StartRedis(t)
	th := harness.NewProxy(t, r.Addr)
	const decision = 100 * time.Millisecond
	c, err := bucket.OpenRedis(th.Addr(), decision)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st := bucket.NewRedisStore(c, bucket.RedisOptions{Timeout: decision, WarmTimeout: 10 * time.Second, DisableAutoPipeline: true})
	ctx := context.Background()
	direct := r.Client()
	if err := direct.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := st.Warm(wctx, bucket.WarmConns); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	exists, err := direct.ScriptExists(ctx, bucket.ScriptSHAs()...).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range exists {
		if !ok {
			t.Fatalf("script %s not loaded after Warm", bucket.ScriptSHAs()[i])
		}
	}

	if err := direct.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// 4 kB/s: the script alone takes over 2s to send, 20 times the
	// decision's timeout; an EVALSHA (about 150 bytes) fits in it.
	th.SetRate(harness.Upstream, 4000)
	req := bucket.Request{Key: bucket.Key("warm", "a"), Limit: bucket.Limit{Burst: 5, Rate: 1}, Cost: 1}
	res, err := st.Take(ctx, req)
	if err != nil || !res.Allowed {
		t.Fatalf("first take after the scripts were flushed = %+v, %v; want decided by Redis", res, err)
	}
	if n := st.Rewarms(); n != 1 {
		t.Fatalf("rewarms = %d, want 1", n)
	}
}
