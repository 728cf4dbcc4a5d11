package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

const globalSplitRule = `
rules:
  - name: shared
    match: {user: "*"}
    burst: 300
    rate: 0
    scope: global
    regions: {eu: {weight: 2}, us: {weight: 1}}
`

// A scope: global, mode: redis rule is split by weight across two regions,
// each enforcing its part in its own Redis: eu (weight 2) admits exactly
// 200 and us (weight 1) exactly 100 of one global burst of 300, however
// hard each is hammered, and neither region's Redis sees the other's key.
func TestGlobalRedisRuleSplitsByWeight(t *testing.T) {
	redisEU, redisUS := harness.StartRedis(t), harness.StartRedis(t)
	eu := startAgentOn(t, redisEU.Addr, globalSplitRule, func(c *agent.Config) { c.Region = "eu" })
	us := startAgentOn(t, redisUS.Addr, globalSplitRule, func(c *agent.Config) { c.Region = "us" })
	hammer := func(a *testAgent, n int) (admitted int64, limit uint64) {
		var ok atomic.Int64
		var lim atomic.Uint64
		var wg sync.WaitGroup
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < n/16; i++ {
					resp, err := a.rl.Allow(context.Background(), &rationv1.AllowRequest{Descriptors: map[string]string{"user": "alice"}})
					if err != nil {
						t.Errorf("Allow: %v", err)
						return
					}
					if resp.Allowed {
						ok.Add(1)
					}
					lim.Store(uint64(resp.Limit))
				}
			}()
		}
		wg.Wait()
		return ok.Load(), lim.Load()
	}
	var wg sync.WaitGroup
	var euN, usN int64
	var euLim, usLim uint64
	wg.Add(2)
	go func() { defer wg.Done(); euN, euLim = hammer(eu, 320) }()
	go func() { defer wg.Done(); usN, usLim = hammer(us, 320) }()
	wg.Wait()
	if euN != 200 || usN != 100 {
		t.Fatalf("admitted eu %d, us %d; want exactly 200 and 100 (300 x 2/3, 300 x 1/3)", euN, usN)
	}
	if euLim != 200 || usLim != 100 {
		t.Errorf("reported limits eu %d, us %d; want each region's share, 200 and 100", euLim, usLim)
	}
	for name, r := range map[string]*harness.Redis{"eu": redisEU, "us": redisUS} {
		if n, err := r.Client().DBSize(context.Background()).Result(); err != nil || n != 1 {
			t.Errorf("%s Redis holds %d keys (%v), want 1: the region's own bucket only", name, n, err)
		}
	}
}

// An agent in a region a global rule gives no share refuses to start,
// naming the rule and the region, rather than guess one.
func TestGlobalRedisRuleRefusesUnknownRegion(t *testing.T) {
	r := harness.StartRedis(t)
	cfg := agent.DefaultConfig()
	cfg.RulesFile = filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(cfg.RulesFile, []byte(globalSplitRule), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Redis = r.Addr
	cfg.Region = "ap"
	cfg.HTTPAddr, cfg.GRPCAddr = "127.0.0.1:0", "127.0.0.1:0"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv, err := agent.Start(ctx, cfg, testLogger(t), nil)
	if err == nil {
		_ = srv.Shutdown(ctx)
		t.Fatal("agent.Start in region ap succeeded, want an error: the rule has no share for ap")
	}
	if !strings.Contains(err.Error(), "shared") || !strings.Contains(err.Error(), `"ap"`) {
		t.Fatalf("agent.Start error = %v, want it to name rule shared and region ap", err)
	}
}
