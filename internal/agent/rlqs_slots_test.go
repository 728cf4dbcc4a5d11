package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ration-dev/ration/internal/agent"
	"github.com/ration-dev/ration/internal/harness"
)

// One connection opens as many RLQS streams as the agent holds, and never
// reports on them: it took every slot, and every Envoy was refused
// RESOURCE_EXHAUSTED for as long as the connection stayed open. A
// connection holds at most -rlqs-max-client-streams (8) streams, and a
// stream that reports nothing is ended (its first report is due within
// 5s here): an honest Envoy is served beside it, and the silent streams'
// slots come back.
func TestRLQSOneConnectionCannotTakeEverySlot(t *testing.T) {
	const slots = 16
	a := startAgent(t, envoyRules, func(cfg *agent.Config) {
		cfg.RLQS.MaxStreams = slots
		cfg.RLQS.Silent = 5 * time.Second
	})
	conn, err := grpc.NewClient(a.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// Three times the silent streams' first-report allowance (5s).
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	ends := make(chan error, slots)
	for range slots {
		s, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			_, err := s.Recv()
			ends <- err
		}()
	}
	exhausted := 0
	for range slots - 8 {
		if err := <-ends; status.Code(err) == codes.ResourceExhausted {
			exhausted++
		} else {
			t.Fatalf("a stream of the hoarding connection ended (%v) before any was silent long enough, want RESOURCE_EXHAUSTED", err)
		}
	}
	honest := harness.DialRLQS(t, a.srv.GRPCAddr(), "edge", 500*time.Millisecond, nil)
	admitted := 0
	for i := 0; i < 20 && admitted == 0; i++ {
		if honest.Request(map[string]string{"tenant": "acme"}) { // no rule: ALLOW_ALL
			admitted++
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := honest.Err(); err != nil || admitted == 0 {
		t.Fatalf("an honest Envoy beside a connection holding %d silent streams: %d admitted, stream error %v", slots-exhausted, admitted, err)
	}
	for range 8 {
		// Ended by the agent (its message), not by this test's own
		// deadline.
		if err := <-ends; status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "no report in time") {
			t.Errorf("a silent stream ended (%v), want the agent's DEADLINE_EXCEEDED for no report", err)
		}
	}
}
