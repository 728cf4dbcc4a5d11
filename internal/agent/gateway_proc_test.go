package agent_test

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// gatewayProc is one gateway process (nginx, Caddy) started by a test: in
// its own process group (master and workers stop together, and die with
// the test binary), its files under dir.
type gatewayProc struct {
	name     string
	base     string   // http://127.0.0.1:port
	dir      string   // its files
	logFiles []string // in dir, shown on failure
	// ready reports that the port is the gateway's own (it has set up its
	// listeners), not another process's that happened to take it.
	ready func(g *gatewayProc) bool
	cmd   *exec.Cmd
	done  chan struct{}
}

// start runs cmd with its output in dir/<first log file> and waits until
// it listens on port; on failure the process is gone.
func (g *gatewayProc) start(t *testing.T, cmd *exec.Cmd, port int) error {
	t.Helper()
	out, err := os.Create(filepath.Join(g.dir, g.logFiles[0]))
	if err != nil {
		t.Fatal(err)
	}
	g.cmd, g.done = cmd, make(chan struct{})
	g.cmd.Stdout, g.cmd.Stderr = out, out
	g.cmd.SysProcAttr = nginxProcAttr()
	if err := g.cmd.Start(); err != nil {
		out.Close()
		t.Fatalf("start %s: %v", g.name, err)
	}
	out.Close()
	go func() { _ = g.cmd.Wait(); close(g.done) }()
	if err := g.waitListening(port); err != nil {
		g.kill()
		return err
	}
	t.Cleanup(func() { g.stop(t) })
	return nil
}

func (g *gatewayProc) waitListening(port int) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-g.done:
			return fmt.Errorf("%s exited at start", g.name)
		default:
		}
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err == nil {
			c.Close()
			if g.ready(g) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New(g.name + " not listening on " + strconv.Itoa(port) + " within 15s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (g *gatewayProc) logs() string {
	var s string
	for _, f := range g.logFiles {
		data, _ := os.ReadFile(filepath.Join(g.dir, f))
		s += fmt.Sprintf("--- %s %s ---\n%s", g.name, f, data)
	}
	return s
}

// kill ends the process group at once.
func (g *gatewayProc) kill() {
	_ = syscall.Kill(-g.cmd.Process.Pid, syscall.SIGKILL)
	<-g.done
}

// stop asks for a fast shutdown (SIGTERM), then kills what is left.
func (g *gatewayProc) stop(t *testing.T) {
	if t.Failed() {
		t.Log(g.logs())
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(5 * time.Second):
	}
	g.kill()
}

// spendAliceBudget spends alice's per-user budget (burst 3, 1 per hour)
// through a gateway at base: 3 admitted with the quota fields, each
// reaching the app, then 429 with the agent's Retry-After and fields and
// the app not called.
func spendAliceBudget(t *testing.T, base string, app *upstreamApp) {
	t.Helper()
	alice := map[string]string{"X-User-Id": "alice"}
	for i := 0; i < 3; i++ {
		r := send(t, http.MethodGet, base+"/", alice)
		if r.code != http.StatusOK || r.body != "hello from the app\n" {
			t.Fatalf("request %d = %d %q, want 200 from the app", i, r.code, r.body)
		}
		// burst 3 at 1 per hour: w = 3 / (1/3600) s.
		if got := r.h.Get("RateLimit-Policy"); got != `"per-user";q=3;w=10800` {
			t.Fatalf("request %d RateLimit-Policy = %q", i, got)
		}
		if got := r.rateLimit(t, "per-user").Remaining; got != int64(2-i) {
			t.Fatalf("request %d RateLimit r = %d, want %d", i, got, 2-i)
		}
	}
	r := send(t, http.MethodGet, base+"/", alice)
	if r.code != http.StatusTooManyRequests {
		t.Fatalf("4th request = %d %q, want 429\n%v", r.code, r.body, r.h)
	}
	if ra, err := strconv.Atoi(r.h.Get("Retry-After")); err != nil || ra < 1 || ra > 3600 {
		t.Fatalf("Retry-After = %q, want 1..3600 seconds (one token per hour)", r.h.Get("Retry-After"))
	}
	if lim := r.rateLimit(t, "per-user"); lim.Remaining != 0 {
		t.Fatalf("429 RateLimit r = %d, want 0", lim.Remaining)
	}
	if r.h.Get("RateLimit-Policy") != `"per-user";q=3;w=10800` {
		t.Fatalf("429 RateLimit-Policy = %q", r.h.Get("RateLimit-Policy"))
	}
	if n := app.seen("alice", ""); n != 3 {
		t.Fatalf("the app saw alice %d times, want 3: a denied request must not reach it", n)
	}
}
