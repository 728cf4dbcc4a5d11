package chaos

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ration-dev/ration/internal/admission"
	"github.com/ration-dev/ration/internal/harness"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// Agent is a gateway-agent process recording every decision (-record).
type Agent struct {
	*Proc
	ID     string
	GRPC   string
	HTTP   string
	Record string // its admission log
	Client rationv1.RateLimiterClient
	// RLS is Envoy's rate-limit service on the same gRPC port.
	RLS rlsv3.RateLimitServiceClient
}

// AgentOptions configure StartAgent.
type AgentOptions struct {
	ID           string
	Rules        string // rules YAML
	Redis        string // -redis (required by the agent even for leased rules)
	Coordinators string // -coordinators, comma separated
	Args         []string
}

// StartAgent starts a gateway-agent process and waits until it is ready
// (its store answered once).
func StartAgent(t testing.TB, o AgentOptions) *Agent {
	t.Helper()
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(o.Rules), 0o644); err != nil {
		t.Fatal(err)
	}
	a := &Agent{
		ID:     o.ID,
		GRPC:   "127.0.0.1:" + strconv.Itoa(harness.FreePort(t)),
		HTTP:   "127.0.0.1:" + strconv.Itoa(harness.FreePort(t)),
		Record: filepath.Join(dir, o.ID+".adm"),
	}
	args := []string{"-id", o.ID, "-rules", rulesPath, "-redis", o.Redis, "-grpc", a.GRPC, "-http", a.HTTP,
		"-record", a.Record, "-log-level", "info"}
	if o.Coordinators != "" {
		// Mutual TLS to the coordinators, with the certificate of its id
		// (tls.go).
		args = append(append(args, "-coordinators", o.Coordinators), tlsFlags(pkiOf(t).Agent(o.ID))...)
	}
	args = append(args, o.Args...)
	a.Proc = StartProc(t, "agent-"+o.ID, "gateway-agent", args...)
	conn, err := grpc.NewClient(a.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	a.Client = rationv1.NewRateLimiterClient(conn)
	a.RLS = rlsv3.NewRateLimitServiceClient(conn)
	a.WaitReady(t)
	return a
}

// WaitReady waits for /readyz to answer 200.
func (a *Agent) WaitReady(t testing.TB) {
	t.Helper()
	hc := &http.Client{Timeout: 500 * time.Millisecond}
	waitFor(t, 20*time.Second, "agent "+a.ID+" ready", func() bool {
		if a.Exited() {
			t.Fatalf("chaos: agent %s exited:\n%s", a.ID, a.Log())
		}
		resp, err := hc.Get("http://" + a.HTTP + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// readRecords merges the admission logs of agents into one history.
func readRecords(t testing.TB, agents ...*Agent) []admission.Record {
	t.Helper()
	var all []admission.Record
	for _, a := range agents {
		f, err := os.Open(a.Record)
		if err != nil {
			t.Fatalf("chaos: admission log of %s: %v", a.ID, err)
		}
		recs, err := admission.Read(f)
		f.Close()
		if err != nil {
			t.Fatalf("chaos: admission log of %s: %v", a.ID, err)
		}
		all = append(all, recs...)
	}
	admission.Sort(all)
	return all
}

// quota is the name the recorder gives a rule's bucket for a subject.
func quota(rule, subject string) string { return fmt.Sprintf("%s|%s", rule, subject) }
