package harness

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// AgentProcess is a gateway-agent running as a process of its own, which a
// test can freeze whole (SIGSTOP) and thaw (SIGCONT): its decisions, its
// lease loop and its timers stop together, as a host's pause stops them.
// Its output goes to a file under t.TempDir(), whose tail is logged when
// the test fails. It is killed in t.Cleanup.
type AgentProcess struct {
	ID   string
	GRPC string // its bound gRPC address
	HTTP string // its bound HTTP address

	t    testing.TB
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// agentStartTimeout bounds the wait for the agent's listeners and then its
// readiness.
const agentStartTimeout = 30 * time.Second

// AgentProcessOptions say what StartAgentProcess runs.
type AgentProcessOptions struct {
	// Bin is a gateway-agent binary, or a test binary that runs as one
	// when Env tells it to (test/bound re-executes itself: no build).
	Bin  string
	ID   string   // -id
	Args []string // its other flags: rules, stores, timings
	Env  []string // added to the test's environment
}

// StartAgentProcess runs an agent process on loopback ports it binds
// itself (-grpc and -http 127.0.0.1:0, so no port is picked before it is
// bound), read from its "gateway-agent started" log line; -log-format
// json is added for that. It returns once /readyz answers 200, or an
// error if the agent exited or was not ready within 30 s.
func StartAgentProcess(t testing.TB, o AgentProcessOptions) (*AgentProcess, error) {
	RequiresProcesses(t)
	id := o.ID
	a := &AgentProcess{ID: id, t: t, log: filepath.Join(t.TempDir(), "agent-"+id+".log"), done: make(chan struct{})}
	f, err := os.Create(a.log)
	if err != nil {
		return nil, fmt.Errorf("harness: agent %s log: %w", id, err)
	}
	all := append([]string{"-id", id, "-grpc", "127.0.0.1:0", "-http", "127.0.0.1:0", "-log-format", "json"}, o.Args...)
	a.cmd = exec.Command(o.Bin, all...)
	a.cmd.Env = append(os.Environ(), o.Env...)
	a.cmd.Stdout, a.cmd.Stderr = f, f
	a.cmd.SysProcAttr = procAttr()
	if err := a.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("harness: start agent %s: %w", id, err)
	}
	go func() { _ = a.cmd.Wait(); f.Close(); close(a.done) }()
	t.Cleanup(a.cleanup)
	deadline := time.Now().Add(agentStartTimeout)
	for a.GRPC == "" {
		a.GRPC, a.HTTP = a.listeners()
		if err := a.waitStep(deadline, "its listeners"); err != nil {
			return nil, err
		}
	}
	hc := &http.Client{Timeout: time.Second}
	for !a.ready(hc) {
		if err := a.waitStep(deadline, "/readyz"); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// waitStep reports the agent's exit or deadline's passing, and otherwise
// sleeps a moment.
func (a *AgentProcess) waitStep(deadline time.Time, what string) error {
	select {
	case <-a.done:
		return fmt.Errorf("harness: agent %s exited before %s:\n%s", a.ID, what, a.Tail(8000))
	default:
	}
	if time.Now().After(deadline) {
		return fmt.Errorf("harness: agent %s: no %s after %v:\n%s", a.ID, what, agentStartTimeout, a.Tail(8000))
	}
	time.Sleep(20 * time.Millisecond)
	return nil
}

// listeners reads the bound addresses from the start line, "" until it is
// written.
func (a *AgentProcess) listeners() (grpcAddr, httpAddr string) {
	b, _ := os.ReadFile(a.log)
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg  string `json:"msg"`
			GRPC string `json:"grpc"`
			HTTP string `json:"http"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "gateway-agent started" {
			return line.GRPC, line.HTTP
		}
	}
	return "", ""
}

func (a *AgentProcess) ready(hc *http.Client) bool {
	resp, err := hc.Get("http://" + a.HTTP + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Pause freezes the process (SIGSTOP): it keeps its connections, and what
// is sent to it waits in its sockets until Resume.
func (a *AgentProcess) Pause() { a.signal(syscall.SIGSTOP) }

// Resume thaws it (SIGCONT).
func (a *AgentProcess) Resume() { a.signal(syscall.SIGCONT) }

func (a *AgentProcess) signal(sig syscall.Signal) {
	a.t.Helper()
	if err := a.cmd.Process.Signal(sig); err != nil {
		a.t.Fatalf("harness: signal %v to agent %s: %v\n%s", sig, a.ID, err, a.Tail(8000))
	}
}

// Exited reports whether the process has ended.
func (a *AgentProcess) Exited() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

// Metrics returns the agent's /metrics page (Prometheus text format).
func (a *AgentProcess) Metrics() (string, error) {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get("http://" + a.HTTP + "/metrics")
	if err != nil {
		return "", fmt.Errorf("agent %s metrics: %w", a.ID, err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(resp.Body); err != nil {
		return "", fmt.Errorf("agent %s metrics: %w", a.ID, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("agent %s metrics: status %d", a.ID, resp.StatusCode)
	}
	return b.String(), nil
}

// Tail returns up to the last n bytes of the process's output.
func (a *AgentProcess) Tail(n int) string {
	b, _ := os.ReadFile(a.log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// cleanup kills the process (a stopped one too: SIGKILL needs no
// SIGCONT) and waits for it.
func (a *AgentProcess) cleanup() {
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.done
	if a.t.Failed() {
		a.t.Logf("harness: agent %s output (tail):\n%s", a.ID, a.Tail(8000))
	}
}
