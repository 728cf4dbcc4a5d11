package agent_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ration-dev/ration/client/header"
	"github.com/ration-dev/ration/internal/harness"
)

// nginxDoc holds the configuration the test runs: the first nginx block of
// the operator's page, so the page cannot drift from what works.
const nginxDoc = "../../docs/integrations/nginx.md"

// The addresses the documented block uses, replaced by the test's.
const (
	docAgentAddr  = "server 127.0.0.1:8080;"
	docAppAddr    = "server 127.0.0.1:3000;"
	docListen     = "listen 80;"
	docAgentDown  = "location @ration_agent_down {\n        return 403;"
	docAgentDown2 = "location @ration_agent_down {\n        return 204;"
)

// documentedNginxBlock extracts the first ```nginx block of the doc.
func documentedNginxBlock(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(nginxDoc)
	if err != nil {
		t.Fatalf("read the documented configuration: %v", err)
	}
	_, rest, ok := strings.Cut(string(doc), "```nginx\n")
	if !ok {
		t.Fatalf("%s has no ```nginx block", nginxDoc)
	}
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("%s: unterminated ```nginx block", nginxDoc)
	}
	for _, s := range []string{docAgentAddr, docAppAddr, docListen, docAgentDown} {
		if strings.Count(block, s) != 1 {
			t.Fatalf("%s: the nginx block must contain %q exactly once (the test replaces it)", nginxDoc, s)
		}
	}
	return block
}

// nginxBinary finds nginx: on PATH, or where Debian installs it (/usr/sbin
// is not on every user's PATH). The test never skips: make test installs it.
func nginxBinary(t *testing.T) string {
	t.Helper()
	harness.RequiresProcesses(t)
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx"
	}
	t.Fatal("nginx not found: install nginx (apt-get install nginx; make test does this via scripts/ensure-deps.sh)")
	return ""
}

// startNginx runs the http-context block under a minimal nginx.conf on a
// free loopback port, as the current user, and returns once it accepts
// connections.
func startNginx(t *testing.T, httpBlock string) *gatewayProc {
	t.Helper()
	bin := nginxBinary(t)
	dir := t.TempDir()
	userLine := ""
	if os.Geteuid() == 0 {
		// Workers would otherwise switch to "nobody", who cannot use dir.
		u, err := user.Current()
		if err != nil {
			t.Fatal(err)
		}
		userLine = "user " + u.Username + ";\n"
	}
	for _, sub := range []string{"body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	errorLog := filepath.Join(dir, "error.log")
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port := harness.FreePort(t)
		conf := fmt.Sprintf(`%sworker_processes 1;
pid %s;
error_log %s info;
events { worker_connections 128; }
http {
    access_log %s;
    client_body_temp_path %s;
    proxy_temp_path %s;
    fastcgi_temp_path %s;
    uwsgi_temp_path %s;
    scgi_temp_path %s;
%s
}
`, userLine, filepath.Join(dir, "nginx.pid"), errorLog, filepath.Join(dir, "access.log"),
			filepath.Join(dir, "body"), filepath.Join(dir, "proxy"), filepath.Join(dir, "fastcgi"),
			filepath.Join(dir, "uwsgi"), filepath.Join(dir, "scgi"),
			strings.Replace(httpBlock, docListen, "listen 127.0.0.1:"+strconv.Itoa(port)+";", 1))
		confPath := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		n := &gatewayProc{name: "nginx", base: "http://127.0.0.1:" + strconv.Itoa(port), dir: dir,
			logFiles: []string{"stdout.log", "error.log"},
			// The pid file is written once the master has set up its
			// listeners: the port is ours, not another process's.
			ready: func(g *gatewayProc) bool {
				_, err := os.Stat(filepath.Join(g.dir, "nginx.pid"))
				return err == nil
			}}
		// -e: the compiled-in error log is never opened; -p: relative paths
		// stay in dir; daemon off: nginx stays our child.
		lastErr = n.start(t, exec.Command(bin, "-p", dir, "-c", confPath, "-e", errorLog, "-g", "daemon off;"), port)
		if lastErr == nil {
			return n
		}
		if logs := n.logs(); !strings.Contains(logs, "Address already in use") {
			t.Fatalf("nginx did not start: %v\n%s", lastErr, logs)
		}
	}
	t.Fatalf("nginx did not start after 5 ports: %v", lastErr)
	return nil
}

// upstreamApp is the application behind nginx: it counts what reaches it.
type upstreamApp struct {
	srv   *httptest.Server
	mu    sync.Mutex
	count map[string]int // by X-User-Id or X-Api-Key-Id
}

func startApp(t *testing.T) *upstreamApp {
	a := &upstreamApp{count: map[string]int{}}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		a.mu.Lock()
		a.count[r.Header.Get("X-User-Id")+"|"+r.Header.Get("X-Api-Key-Id")]++
		a.mu.Unlock()
		if r.URL.Path == "/forbidden" {
			http.Error(w, "the app says no", http.StatusForbidden)
			return
		}
		_, _ = io.WriteString(w, "hello from the app\n")
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *upstreamApp) seen(userID, keyID string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.count[userID+"|"+keyID]
}

type reply struct {
	code int
	h    http.Header
	body string
}

func send(t *testing.T, method, url string, hdr map[string]string) reply {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader(`{"a":"request body the agent must never see"}`)
	}
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// rateLimit parses the reply's RateLimit field: one member, named policy.
func (r reply) rateLimit(t *testing.T, policy string) header.LimitItem {
	t.Helper()
	items, err := header.ParseRateLimit(r.h.Get("RateLimit"))
	if err != nil || len(items) != 1 || items[0].Name != policy {
		t.Fatalf("RateLimit = %q (%v), want one member for %q; reply %d %v", r.h.Get("RateLimit"), err, policy, r.code, r.h)
	}
	return items[0]
}

const nginxRules = `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 3
    rate: 1/h
  - name: search-per-key
    match: {key: "*", route: search}
    burst: 2
    rate: 1/h
`

// Through a real nginx running the documented auth_request configuration,
// in front of a real agent and redis-server: 200 until the budget is spent,
// then 429 with Retry-After and the RateLimit fields, the upstream never
// reached once denied; 503 when the store is down under fail_closed and
// when the agent itself is down; fail open when configured so.
func TestNginxAuthRequest(t *testing.T) {
	nginxBinary(t) // fail first, and clearly, when nginx is missing
	block := documentedNginxBlock(t)
	a := startAgent(t, nginxRules)
	app := startApp(t)
	conf := strings.NewReplacer(
		docAgentAddr, "server "+a.srv.HTTPAddr()+";",
		docAppAddr, "server "+app.srv.Listener.Addr().String()+";",
	).Replace(block)
	ngx := startNginx(t, conf)

	// The budget: 3 admitted, each carrying the quota, then 429; the app
	// is not called once denied.
	spendAliceBudget(t, ngx.base, app)

	// A POST with a body is checked the same way (the body is not sent on).
	if r := send(t, http.MethodPost, ngx.base+"/", map[string]string{"X-User-Id": "bob"}); r.code != http.StatusOK {
		t.Fatalf("POST = %d %q, want 200", r.code, r.body)
	}
	// A value that would inject a descriptor lands in the shared "!invalid"
	// bucket: admitted with a fresh budget, alice's bucket untouched.
	inj := send(t, http.MethodGet, ngx.base+"/", map[string]string{"X-User-Id": "mallory&user=alice"})
	if inj.code != http.StatusOK || inj.rateLimit(t, "per-user").Remaining != 2 {
		t.Fatalf("injecting user = %d %v, want 200 from a fresh bucket (r=2)", inj.code, inj.h)
	}
	// No user and no key: no rule applies; admitted without quota fields.
	if r := send(t, http.MethodGet, ngx.base+"/anonymous", nil); r.code != http.StatusOK || r.h.Get("RateLimit") != "" {
		t.Fatalf("anonymous = %d %v, want 200 with no RateLimit", r.code, r.h)
	}
	// The app's own 403 passes through untouched.
	if r := send(t, http.MethodGet, ngx.base+"/forbidden", map[string]string{"X-User-Id": "carol"}); r.code != http.StatusForbidden || r.body != "the app says no\n" {
		t.Fatalf("the app's 403 = %d %q, want it passed through", r.code, r.body)
	}

	// The path maps to a route: variants of /api/search share its bucket.
	key := map[string]string{"X-Api-Key-Id": "k1"}
	for i, p := range []string{"/api/search", "/api/search/users"} {
		if r := send(t, http.MethodGet, ngx.base+p, key); r.code != http.StatusOK || r.rateLimit(t, "search-per-key").Remaining != int64(1-i) {
			t.Fatalf("%s = %d %v, want 200 from search-per-key", p, r.code, r.h)
		}
	}
	if r := send(t, http.MethodGet, ngx.base+"/api/search;v=2", key); r.code != http.StatusTooManyRequests {
		t.Fatalf("/api/search;v=2 = %d, want 429 (same route, spent)", r.code)
	}
	if r := send(t, http.MethodGet, ngx.base+"/api/items", key); r.code != http.StatusOK {
		t.Fatalf("/api/items = %d, want 200 (another route)", r.code)
	}

	// Redis down, rule fail_closed (the default): 503 with Retry-After: 1
	// and no quota fields; the app is not called.
	a.redis.Stop()
	before := app.seen("dave", "")
	r := send(t, http.MethodGet, ngx.base+"/", map[string]string{"X-User-Id": "dave"})
	if r.code != http.StatusServiceUnavailable || r.h.Get("Retry-After") != "1" || r.h.Get("RateLimit") != "" || r.h.Get("RateLimit-Policy") != "" {
		t.Fatalf("store down, fail_closed = %d %v, want 503 with Retry-After: 1 and no RateLimit fields", r.code, r.h)
	}
	if app.seen("dave", "") != before {
		t.Fatal("the app was called while the limiter answered 503")
	}
	// That 503 was the agent's fail_closed answer, not nginx giving up on a
	// slow agent (which would also be 503, through 504).
	if logs := ngx.logs(); strings.Contains(logs, "timed out") {
		t.Fatalf("nginx timed out on the check; want the agent's own 503\n%s", logs)
	}
	// With Redis back the agent shuts down at once (with it down, the
	// agent's shutdown waits on its store client).
	a.redis.Restart()

	// The agent itself down: nginx's 502 from the check becomes 503.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.srv.Shutdown(ctx); err != nil {
		t.Fatalf("agent shutdown: %v", err)
	}
	r = send(t, http.MethodGet, ngx.base+"/", map[string]string{"X-User-Id": "erin"})
	if r.code != http.StatusServiceUnavailable || r.h.Get("Retry-After") != "1" {
		t.Fatalf("agent down = %d %v, want 503 with Retry-After: 1 (fail closed)", r.code, r.h)
	}

	// The documented fail-open variant admits while the agent is down.
	open := startNginx(t, strings.Replace(conf, docAgentDown, docAgentDown2, 1))
	r = send(t, http.MethodGet, open.base+"/", map[string]string{"X-User-Id": "erin"})
	if r.code != http.StatusOK || app.seen("erin", "") != 1 {
		t.Fatalf("agent down, fail-open variant = %d %q, want 200 from the app", r.code, r.body)
	}
}
