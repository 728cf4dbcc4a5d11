package chaos

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is a real child process (an agent or a coordinator built from this
// tree) that a scenario can SIGKILL, SIGSTOP/SIGCONT and restart. Its
// output goes to a file under t.TempDir(), shown when the test fails. It
// is killed in t.Cleanup.
type Proc struct {
	t    testing.TB
	name string
	bin  string
	args []string
	log  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// binDir holds gateway-agent and coordinator, built once per test binary
// by TestMain.
var binDir string

// StartProc runs binDir/bin with args.
func StartProc(t testing.TB, name, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{t: t, name: name, bin: filepath.Join(binDir, bin), args: args,
		log: filepath.Join(t.TempDir(), name+".log")}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			out, _ := os.ReadFile(p.log)
			if len(out) > 8000 {
				out = out[len(out)-8000:]
			}
			t.Logf("chaos: %s output (tail):\n%s", p.name, out)
		}
	})
	p.Start()
	return p
}

// Start (re)starts the process with its arguments, appending to its log.
func (p *Proc) Start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		p.t.Fatalf("chaos: start %s: already running", p.name)
	}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatalf("chaos: %s log: %v", p.name, err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group: a terminal's ^C does not reach it twice, and
	// SIGSTOP of the group stops it whole.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		p.t.Fatalf("chaos: start %s: %v", p.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(done) }()
	p.cmd, p.done = cmd, done
}

// Kill sends SIGKILL (to a stopped process too) and waits for it to die.
func (p *Proc) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Pause sends SIGSTOP; Resume sends SIGCONT.
func (p *Proc) Pause()  { p.signal(syscall.SIGSTOP) }
func (p *Proc) Resume() { p.signal(syscall.SIGCONT) }

func (p *Proc) signal(sig syscall.Signal) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		p.t.Fatalf("chaos: signal %v to %s: not running", sig, p.name)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("chaos: signal %v to %s: %v", sig, p.name, err)
	}
}

// Exited reports whether the process has died on its own.
func (p *Proc) Exited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return true
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Log returns the process's output so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.log)
	return string(bytes.TrimSpace(b))
}

// waitFor polls cond every 20ms for up to d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("chaos: timed out after %v waiting for %s", d, fmt.Sprint(what))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
