package deploy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// repoRoot is the root module, one level up from this module.
const repoRoot = ".."

// binDir holds the binaries TestMain built with the Dockerfile's commands.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "ration-deploy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	binDir = filepath.Join(tmp, "out")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tb := &mainTB{}
	func() {
		defer func() {
			if r := recover(); r != nil && r != errMainFatal {
				panic(r)
			}
		}()
		buildLikeDocker(tb, binDir)
	}()
	if tb.failed {
		fmt.Fprintln(os.Stderr, "building the binaries with the Dockerfile's commands failed:\n"+tb.log.String())
		return 1
	}
	return m.Run()
}

var errMainFatal = fmt.Errorf("fatal in TestMain")

// mainTB lets TestMain use helpers written for testing.TB.
type mainTB struct {
	testing.TB
	failed bool
	log    strings.Builder
}

func (m *mainTB) Helper() {}
func (m *mainTB) Fatal(args ...any) {
	m.failed = true
	fmt.Fprintln(&m.log, args...)
	panic(errMainFatal)
}
func (m *mainTB) Fatalf(format string, args ...any) {
	m.Fatal(fmt.Sprintf(format, args...))
}

func binary(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(binDir, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("binary %s: %v", name, err)
	}
	return p
}

// proc is a binary running for one test, its stderr kept and scanned.
type proc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

// start runs a binary with exactly env (plus PATH and HOME) and stops it
// at the end of the test: SIGTERM, then SIGKILL after 15s.
func start(t testing.TB, name string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(binary(t, name), args...)
	p.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + t.TempDir()}, env...)
	pr, pw := io.Pipe()
	p.cmd.Stderr = pw
	p.cmd.Stdout = pw
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
		io.Copy(io.Discard, pr)
	}()
	go func() {
		p.cmd.Wait()
		pw.Close()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(t) })
	return p
}

func (p *proc) stop(t testing.TB) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		t.Errorf("%s did not stop within 15s of SIGTERM", p.name)
	}
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// wait returns the first submatch of re in the output, waiting up to
// timeout; it fails if the process exits first.
func (p *proc) wait(t testing.TB, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if m := re.FindStringSubmatch(p.output()); m != nil {
			return m
		}
		select {
		case <-p.done:
			if m := re.FindStringSubmatch(p.output()); m != nil {
				return m
			}
			t.Fatalf("%s exited (%v) before logging %q:\n%s", p.name, p.cmd.ProcessState, re, p.output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within %v:\n%s", p.name, re, timeout, p.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var (
	// The start-up lines name the bound addresses: [1] gRPC, [2] HTTP
	// (and [3] the coordinator's admin listener).
	agentStarted = regexp.MustCompile(`msg="gateway-agent started".* grpc=(\S+) http=(\S+)`)
	coordStarted = regexp.MustCompile(`msg="coordinator started".* grpc_addr=(\S+) http_addr=(\S+) admin_addr=(\S+)`)
)

// httpGet fetches a loopback URL.
func httpGet(t testing.TB, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func httpPost(t testing.TB, url, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// eventually polls cond every 50ms until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
