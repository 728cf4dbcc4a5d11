package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ration-dev/ration/internal/tlsfiles"
)

// How long a server may take to answer PING after it was started, and to
// exit after SIGTERM before it is killed.
const (
	startTimeout = 15 * time.Second
	stopTimeout  = 5 * time.Second
	// startAttempts bounds retries when a chosen port was taken meanwhile.
	startAttempts = 5
)

// Redis is one redis-server (or Sentinel) process started by StartRedis. It
// runs on 127.0.0.1:Port with its own directory, no persistence, and is
// stopped when the test ends; its log is dumped if the test failed.
type Redis struct {
	Addr string // 127.0.0.1:Port
	Port int
	// TLSAddr is 127.0.0.1:TLSPort, where the server speaks TLS (WithTLS);
	// "" otherwise. Addr stays plaintext, for the harness and tests.
	TLSAddr string
	TLSPort int

	t        testing.TB
	name     string // for messages: "redis", "sentinel"
	bin      string
	dir      string
	conf     string   // config file path
	args     []string // after the config file
	busPort  int      // cluster bus port, 0 when not a cluster node
	sentinel bool
	env      []string // added to the process's environment

	mu     sync.Mutex
	proc   *os.Process
	done   chan struct{} // closed when proc has exited
	paused bool
	client *redis.Client
	// password is the server's requirepass (WithPassword), which the
	// harness's own probe and Client send.
	password string
}

// RedisOption adds to a server's configuration.
type RedisOption func(*redisConfig)

type redisConfig struct {
	lines    []string
	sentinel bool
	cluster  bool
	tls      []string // tls-* lines (WithTLS); the port is added at start
	password string   // requirepass (WithPassword)
	env      []string // added to the process's environment (WithClock)
	// replicas: StartCluster gives each master a replica
	// (WithClusterReplicas); other starts ignore it.
	replicas bool
}

// WithPassword sets requirepass: every client, the harness's included,
// must AUTH with password (for a Sentinel: the Sentinels' own password,
// and what they send to each other).
func WithPassword(password string) RedisOption {
	return func(c *redisConfig) {
		c.password = password
		c.lines = append(c.lines, "requirepass "+password)
	}
}

// WithTLS makes the server also listen with TLS on a port of its own
// (Redis.TLSAddr), presenting server (files of a PKI certificate for
// 127.0.0.1) and verifying clients against server.CA: with
// requireClientCert, a client without a certificate of that CA is
// refused (tls-auth-clients yes).
func WithTLS(server tlsfiles.Files, requireClientCert bool) RedisOption {
	auth := "no"
	if requireClientCert {
		auth = "yes"
	}
	return func(c *redisConfig) {
		c.tls = []string{"tls-cert-file " + server.Cert, "tls-key-file " + server.Key,
			"tls-ca-cert-file " + server.CA, "tls-auth-clients " + auth}
	}
}

// WithConfig adds redis.conf lines, e.g. "maxmemory-policy allkeys-lru" or
// "min-replicas-to-write 1".
func WithConfig(lines ...string) RedisOption {
	return func(c *redisConfig) { c.lines = append(c.lines, lines...) }
}

// WithReplicaOf makes the server a replica of addr (host:port).
func WithReplicaOf(addr string) RedisOption {
	return func(c *redisConfig) {
		host, port, _ := strings.Cut(addr, ":")
		c.lines = append(c.lines, "replicaof "+host+" "+port)
	}
}

// StartRedis starts a redis-server on a free loopback port (save "",
// appendonly no, bind 127.0.0.1, dir a fresh t.TempDir()) and returns once it
// answers PING. It is stopped in t.Cleanup.
func StartRedis(t testing.TB, opts ...RedisOption) *Redis {
	t.Helper()
	var c redisConfig
	for _, o := range opts {
		o(&c)
	}
	return startRedis(t, c)
}

func startRedis(t testing.TB, c redisConfig) *Redis {
	t.Helper()
	r := &Redis{
		t:        t,
		name:     "redis",
		bin:      RequireBinary(t, "redis-server", "redis-server"),
		dir:      t.TempDir(),
		sentinel: c.sentinel,
		password: c.password,
		env:      c.env,
	}
	if c.sentinel {
		r.name = "sentinel"
		r.args = []string{"--sentinel"}
	}
	r.conf = filepath.Join(r.dir, "redis.conf")
	t.Cleanup(r.cleanup)
	var lastErr error
	for attempt := 0; attempt < startAttempts; attempt++ {
		r.Port = FreePort(t)
		r.Addr = "127.0.0.1:" + strconv.Itoa(r.Port)
		if c.cluster {
			r.busPort = FreePort(t)
		}
		lines := c.lines
		if c.tls != nil {
			r.TLSPort = FreePort(t)
			r.TLSAddr = "127.0.0.1:" + strconv.Itoa(r.TLSPort)
			lines = append(append([]string{"tls-port " + strconv.Itoa(r.TLSPort)}, c.tls...), lines...)
		}
		if err := os.WriteFile(r.conf, []byte(r.config(lines)), 0o600); err != nil {
			t.Fatalf("harness: write %s: %v", r.conf, err)
		}
		lastErr = r.start()
		if lastErr == nil {
			return r
		}
		if !errors.Is(lastErr, errPortTaken) {
			break
		}
	}
	t.Fatalf("harness: start %s: %v\n%s", r.name, lastErr, r.logs())
	return nil
}

func (r *Redis) config(extra []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n", r.Port, r.dir, filepath.Join(r.dir, "redis.log"))
	if !r.sentinel {
		b.WriteString("save \"\"\nappendonly no\n")
	}
	if r.busPort != 0 {
		fmt.Fprintf(&b, "cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-port %d\n", r.busPort)
	}
	for _, l := range extra {
		b.WriteString(l + "\n")
	}
	return b.String()
}

var errPortTaken = errors.New("port already in use")

// start runs the process and waits until it answers as itself.
func (r *Redis) start() error {
	out, err := os.OpenFile(filepath.Join(r.dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	// A leftover redis.log from a failed attempt would confuse the
	// port-taken check below.
	logPath := filepath.Join(r.dir, "redis.log")
	_ = os.Rename(logPath, logPath+".prev")
	cmd := exec.Command(r.bin, append([]string{r.conf}, r.args...)...)
	cmd.Dir = r.dir
	if len(r.env) > 0 {
		cmd.Env = append(os.Environ(), r.env...)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	r.mu.Lock()
	r.proc, r.done, r.paused = cmd.Process, done, false
	r.mu.Unlock()

	c := redis.NewClient(&redis.Options{
		Addr: r.Addr, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1, Protocol: 2, Password: r.password,
	})
	defer c.Close()
	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-done:
			log, _ := os.ReadFile(logPath)
			if strings.Contains(string(log), "Address already in use") {
				return errPortTaken
			}
			return fmt.Errorf("%s on port %d exited at start", r.name, r.Port)
		default:
		}
		// Ask for the pid: another process that grabbed the port would
		// answer PING too.
		if info, err := c.Info(context.Background(), "server").Result(); err == nil {
			if infoField(info, "process_id") == strconv.Itoa(cmd.Process.Pid) {
				return nil
			}
			_ = cmd.Process.Kill()
			<-done
			return errPortTaken
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("%s on port %d did not answer within %v", r.name, r.Port, startTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// infoField reads "name:value" from an INFO reply.
func infoField(info, name string) string {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// Client returns a client of this server alone, for a test to inspect or
// set up state. It is closed with the server's cleanup.
func (r *Redis) Client() *redis.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.client == nil {
		r.client = redis.NewClient(&redis.Options{Addr: r.Addr, DialTimeout: 2 * time.Second, ReadTimeout: 5 * time.Second, Password: r.password})
	}
	return r.client
}

// Stop shuts the server down (SIGTERM, then SIGKILL after a bound) and waits
// for it to exit. Stopping a stopped server does nothing.
func (r *Redis) Stop() {
	r.t.Helper()
	r.signalAndWait(syscall.SIGTERM)
}

// Kill ends the server with SIGKILL, as a crash would, and waits for it.
func (r *Redis) Kill() {
	r.t.Helper()
	r.signalAndWait(syscall.SIGKILL)
}

// Pause freezes the server (SIGSTOP): it keeps its connections but answers
// nothing until Resume.
func (r *Redis) Pause() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		if err := r.proc.Signal(syscall.SIGSTOP); err != nil {
			r.t.Fatalf("harness: pause %s %s: %v", r.name, r.Addr, err)
		}
		r.paused = true
	}
}

// Resume continues a paused server (SIGCONT).
func (r *Redis) Resume() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil && r.paused {
		if err := r.proc.Signal(syscall.SIGCONT); err != nil {
			r.t.Fatalf("harness: resume %s %s: %v", r.name, r.Addr, err)
		}
		r.paused = false
	}
}

// Restart stops the server if it runs and starts it again on the same port,
// with the same configuration and directory (a Cluster node keeps its
// nodes.conf; data is not kept, there is no persistence).
func (r *Redis) Restart() {
	r.t.Helper()
	r.Stop()
	var err error
	// The port was ours a moment ago; give a racing process's grab, or a
	// lingering socket, a few tries.
	for attempt := 0; attempt < startAttempts; attempt++ {
		if err = r.start(); err == nil {
			return
		}
		if !errors.Is(err, errPortTaken) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	r.t.Fatalf("harness: restart %s %s: %v\n%s", r.name, r.Addr, err, r.logs())
}

// Running reports whether the process is alive (paused counts as alive).
func (r *Redis) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return false
	}
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

func (r *Redis) signalAndWait(sig syscall.Signal) {
	r.mu.Lock()
	proc, done, paused := r.proc, r.done, r.paused
	r.proc, r.paused = nil, false
	r.mu.Unlock()
	if proc == nil {
		return
	}
	_ = proc.Signal(sig)
	if paused && sig != syscall.SIGKILL {
		_ = proc.Signal(syscall.SIGCONT) // a stopped process cannot handle SIGTERM
	}
	select {
	case <-done:
	case <-time.After(stopTimeout):
		_ = proc.Kill()
		<-done
	}
}

func (r *Redis) cleanup() {
	r.signalAndWait(syscall.SIGKILL)
	r.mu.Lock()
	if r.client != nil {
		_ = r.client.Close()
	}
	r.mu.Unlock()
	if r.t.Failed() {
		r.t.Logf("%s %s (%s):\n%s", r.name, r.Addr, r.dir, r.logs())
	}
}

// logs returns the server's output and the tail of its log.
func (r *Redis) logs() string {
	var b strings.Builder
	if out, err := os.ReadFile(filepath.Join(r.dir, "stdout.log")); err == nil && len(out) > 0 {
		fmt.Fprintf(&b, "--- stdout/stderr\n%s", out)
	}
	if log, err := os.ReadFile(filepath.Join(r.dir, "redis.log")); err == nil {
		lines := strings.Split(strings.TrimRight(string(log), "\n"), "\n")
		const tail = 80
		if len(lines) > tail {
			fmt.Fprintf(&b, "--- redis.log (last %d of %d lines)\n", tail, len(lines))
			lines = lines[len(lines)-tail:]
		} else {
			b.WriteString("--- redis.log\n")
		}
		b.WriteString(strings.Join(lines, "\n"))
	}
	return b.String()
}
