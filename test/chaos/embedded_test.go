package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ration-dev/ration/limiter"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// The embedded variants of S0 and S3: the same scenarios, with one agent
// an embedded limiter (package limiter) deciding inside the test process,
// as a Go gateway would, instead of a gateway-agent process. It records
// every decision (limiter.Config.RecordFile, the sidecar's -record), the
// load calls it directly, and the same judges hold both agents' records
// and what the clients received to the scenario's bound.

// TestS0Embedded is S0 with its second agent embedded: a sidecar and an
// embedded limiter share each quota, in one Redis and one coordinator
// group. Break: RATION_CHAOS_BREAK=S0e (the embedded limiter gets a Redis
// and a group of its own, as S0's break does to its second agent).
func TestS0Embedded(t *testing.T) {
	scenario(t)
	s0(t, ", one agent embedded", "S0e", StartEmbedded)
}

// TestS3Embedded is S3 with the cut agent embedded: the limiter is cut
// from the coordinators for 3 lease periods while a sidecar takes the
// reclaimed budget. Break: RATION_CHAOS_BREAK=S3e (the embedded limiter
// gets S3's looser rules).
func TestS3Embedded(t *testing.T) {
	scenario(t)
	s3(t, ", cut agent embedded", "S3e", StartEmbedded)
}

// StartEmbedded starts an embedded limiter in the test process with the
// configuration StartAgent gives a gateway-agent (rules file, Redis,
// coordinators over mutual TLS with the certificate of its id, admission
// log) and waits until it is ready. Its Agent has no process: Client
// calls the limiter, and only Allow is served. It is closed at the end of
// the test, and its log is printed if the test failed.
func StartEmbedded(t testing.TB, o AgentOptions) *Agent {
	t.Helper()
	if len(o.Args) > 0 {
		t.Fatalf("chaos: embedded agent %s: flags %q have no limiter.Config field here", o.ID, o.Args)
	}
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(o.Rules), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, o.ID+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{ID: o.ID, Record: filepath.Join(dir, o.ID+".adm")}
	cfg := limiter.Config{
		RulesFile:  rulesPath,
		Redis:      o.Redis,
		AgentID:    o.ID,
		RecordFile: a.Record,
		Logger:     slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	if o.Coordinators != "" {
		f := pkiOf(t).Agent(o.ID)
		cfg.Coordinators = strings.Split(o.Coordinators, ",")
		cfg.TLSCert, cfg.TLSKey, cfg.TLSCA = f.Cert, f.Key, f.CA
	}
	l, err := limiter.New(context.Background(), cfg)
	if err != nil {
		logFile.Close()
		t.Fatalf("chaos: embedded agent %s: %v", o.ID, err)
	}
	t.Cleanup(func() {
		l.Close()
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("chaos: log of embedded agent %s:\n%s", o.ID, b)
		}
	})
	a.Client = embeddedClient{l: l}
	waitFor(t, 20*time.Second, "embedded agent "+o.ID+" ready", l.Ready)
	return a
}

// embeddedClient serves the load's Allow calls from a limiter, as the
// sidecar's gRPC Allow serves them from its Service.
type embeddedClient struct {
	rationv1.RateLimiterClient // nil: AllowBatch and AllowStream are not served
	l                          *limiter.Limiter
}

var embeddedReasons = map[limiter.Reason]rationv1.Reason{
	limiter.ReasonOK:          rationv1.Reason_REASON_OK,
	limiter.ReasonOverLimit:   rationv1.Reason_REASON_OVER_LIMIT,
	limiter.ReasonNoRule:      rationv1.Reason_REASON_NO_RULE,
	limiter.ReasonShadow:      rationv1.Reason_REASON_SHADOW,
	limiter.ReasonUnavailable: rationv1.Reason_REASON_UNAVAILABLE,
	limiter.ReasonEmergency:   rationv1.Reason_REASON_EMERGENCY,
}

func (c embeddedClient) Allow(ctx context.Context, in *rationv1.AllowRequest, _ ...grpc.CallOption) (*rationv1.AllowResponse, error) {
	d, err := c.l.Allow(ctx, limiter.Request{
		Descriptors: in.GetDescriptors(), Rule: in.GetRule(), Subject: in.GetSubject(), Cost: in.GetCost(), RequestID: in.GetRequestId(),
	})
	if err != nil {
		return nil, err
	}
	r, ok := embeddedReasons[d.Reason]
	if !ok {
		return nil, fmt.Errorf("chaos: embedded limiter answered reason %v, which has no ration.v1 reason", d.Reason)
	}
	return &rationv1.AllowResponse{Allowed: d.Allowed, Reason: r, Rule: d.Rule}, nil
}
