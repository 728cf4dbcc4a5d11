package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
	"github.com/ration-dev/ration/internal/rules"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// BenchmarkAutoPromotion measures how long a mode auto subject that jumps
// from nothing to 300 decisions/s (5x promote_above 60) takes to be decided
// on a lease: one agent on a real Redis and a real 1-node coordinator, a
// fresh subject per iteration. It reports the time from the first decision
// to the agent's promotion taken up (polled every 5ms), and that time less
// when the store's rate estimate (time constant rules.HotTau) crosses the
// threshold at the rate offered, which is what "promotion within 1 s of
// crossing the threshold" measures.
//
//	go test -run '^$' -bench AutoPromotion -benchtime 5x ./internal/agent/
func BenchmarkAutoPromotion(b *testing.B) {
	c := harness.StartCoordinators(b, 1, autoRules)
	r := harness.StartRedis(b)
	dir := b.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, []byte(autoRules), 0o644); err != nil {
		b.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.RulesFile, cfg.Redis = path, r.Addr
	cfg.HTTPAddr, cfg.GRPCAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Coordinators, cfg.Insecure = strings.Join(c.GRPCAddrs(), ","), true
	srv, err := agent.Start(context.Background(), cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	rl := rationv1.NewRateLimiterClient(conn)
	for deadline := time.Now().Add(15 * time.Second); !srv.Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("agent not ready")
		}
	}
	const offered, promote = 300.0, 60.0
	crossing := time.Duration(-rules.HotTau.Seconds() * math.Log(1-promote/offered) * float64(time.Second))
	promotions := func() float64 {
		mfs, err := srv.Registry.Gather()
		if err != nil {
			b.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "ration_agent_hot_promotions_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return 0
	}
	var total time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		before := promotions()
		req := &rationv1.AllowRequest{Descriptors: map[string]string{"tenant": fmt.Sprintf("jump%d", i)}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		done := make(chan struct{})
		go func() { // open loop at the offered rate, bounded by ctx
			defer close(done)
			t := time.NewTicker(time.Second / time.Duration(offered))
			defer t.Stop()
			for n := 0; n < int(10*offered); n++ {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				go func() { _, _ = rl.Allow(ctx, req) }()
			}
		}()
		start := time.Now()
		for promotions() == before {
			if ctx.Err() != nil {
				b.Fatalf("subject %d not promoted within 10s at %v/s (promote_above %v)", i, offered, promote)
			}
			time.Sleep(5 * time.Millisecond)
		}
		total += time.Since(start)
		cancel()
		<-done
	}
	b.StopTimer()
	mean := total / time.Duration(b.N)
	b.ReportMetric(mean.Seconds(), "s-to-promotion")
	b.ReportMetric((mean - crossing).Seconds(), "s-after-crossing")
}
