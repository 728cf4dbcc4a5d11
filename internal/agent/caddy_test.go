package agent_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/harness"
)

// caddyDoc holds the configuration the test runs: the first caddyfile
// block of the operator's page, so the page cannot drift from what works.
const caddyDoc = "../../docs/integrations/caddy.md"

// The addresses the documented block uses, replaced by the test's.
const (
	caddyDocSite  = ":80 {"
	caddyDocAgent = "127.0.0.1:8080"
	caddyDocApp   = "127.0.0.1:3000"
)

// documentedCaddyBlock extracts the first ```caddyfile block of the doc.
func documentedCaddyBlock(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(caddyDoc)
	if err != nil {
		t.Fatalf("read the documented configuration: %v", err)
	}
	_, rest, ok := strings.Cut(string(doc), "```caddyfile\n")
	if !ok {
		t.Fatalf("%s has no ```caddyfile block", caddyDoc)
	}
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("%s: unterminated ```caddyfile block", caddyDoc)
	}
	if !strings.HasPrefix(block, caddyDocSite) {
		t.Fatalf("%s: the caddyfile block must start with %q (the test replaces it)", caddyDoc, caddyDocSite)
	}
	if strings.Count(block, caddyDocAgent) == 0 || strings.Count(block, caddyDocApp) != 1 {
		t.Fatalf("%s: the caddyfile block must name the agent %q and the app %q (once)", caddyDoc, caddyDocAgent, caddyDocApp)
	}
	return block
}

// caddyBinary finds caddy. The test never skips: make test installs it.
func caddyBinary(t *testing.T) string {
	t.Helper()
	harness.RequiresProcesses(t)
	if p, err := exec.LookPath("caddy"); err == nil {
		return p
	}
	t.Fatal("caddy not found: install caddy (apt-get install caddy; make test does this via scripts/ensure-deps.sh)")
	return ""
}

// startCaddy runs the site block, with the admin endpoint and automatic
// HTTPS off, on a free loopback port, and returns once it accepts
// connections.
func startCaddy(t *testing.T, site string) *gatewayProc {
	t.Helper()
	bin := caddyBinary(t)
	dir := t.TempDir()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port := harness.FreePort(t)
		conf := "{\n\tadmin off\n\tauto_https off\n}\n" +
			strings.Replace(site, caddyDocSite, "http://127.0.0.1:"+strconv.Itoa(port)+" {", 1)
		confPath := filepath.Join(dir, "Caddyfile")
		if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		c := &gatewayProc{name: "caddy", base: "http://127.0.0.1:" + strconv.Itoa(port), dir: dir,
			logFiles: []string{"caddy.log"},
			// Caddy logs this once its servers listen: the port is ours.
			ready: func(g *gatewayProc) bool { return strings.Contains(g.logs(), "serving initial configuration") }}
		cmd := exec.Command(bin, "run", "--config", confPath, "--adapter", "caddyfile")
		// Caddy keeps its state under XDG directories: ours, not the user's.
		cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "XDG_DATA_HOME="+filepath.Join(dir, "data"), "HOME="+dir)
		lastErr = c.start(t, cmd, port)
		if lastErr == nil {
			return c
		}
		if logs := c.logs(); !strings.Contains(logs, "address already in use") {
			t.Fatalf("caddy did not start: %v\n%s", lastErr, logs)
		}
	}
	t.Fatalf("caddy did not start after 5 ports: %v", lastErr)
	return nil
}

const caddyRules = `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 3
    rate: 1/h
  - name: search-per-user
    match: {user: "*", route: search}
    burst: 10
    rate: 1/h
`

// Through a real Caddy running the documented forward_auth configuration,
// in front of a real agent and redis-server: 200 until the budget is spent,
// then 429 with Retry-After and the RateLimit fields, the upstream never
// reached once denied; a header value that is not a plain id lands in one
// shared bucket; 503 with Retry-After: 1 when the store is down under
// fail_closed and when the agent itself is down.
func TestCaddyForwardAuth(t *testing.T) {
	caddyBinary(t) // fail first, and clearly, when caddy is missing
	block := documentedCaddyBlock(t)
	a := startAgent(t, caddyRules)
	app := startApp(t)
	site := strings.NewReplacer(caddyDocAgent, a.srv.HTTPAddr(), caddyDocApp, app.srv.Listener.Addr().String()).Replace(block)
	cd := startCaddy(t, site)

	// The budget: 3 admitted, each carrying the quota, then 429; the app
	// is not called once denied.
	spendAliceBudget(t, cd.base, app)

	// Values that are not plain ids (one that would inject a descriptor,
	// one with a space) share the "!invalid" bucket: admitted from a fresh
	// budget, then limited together; alice's bucket is untouched.
	inj := send(t, http.MethodGet, cd.base+"/", map[string]string{"X-User-Id": "mallory&user=alice"})
	if inj.code != http.StatusOK || inj.rateLimit(t, "per-user").Remaining != 2 {
		t.Fatalf("injecting user = %d %v, want 200 from a fresh bucket (r=2)", inj.code, inj.h)
	}
	sp := send(t, http.MethodGet, cd.base+"/", map[string]string{"X-User-Id": "a b"})
	if sp.code != http.StatusOK || sp.rateLimit(t, "per-user").Remaining != 1 {
		t.Fatalf("user with a space = %d %v, want 200 from the same !invalid bucket (r=1)", sp.code, sp.h)
	}
	// A client's own quota fields never pass for the agent's.
	if r := send(t, http.MethodGet, cd.base+"/anonymous", map[string]string{"RateLimit": `"per-user";r=99;t=0`}); r.code != http.StatusOK || r.h.Get("RateLimit") != "" || r.h.Get("RateLimit-Policy") != "" {
		t.Fatalf("anonymous = %d %v, want 200 with no RateLimit fields", r.code, r.h)
	}
	// The app's own 403 passes through untouched.
	if r := send(t, http.MethodGet, cd.base+"/forbidden", map[string]string{"X-User-Id": "carol"}); r.code != http.StatusForbidden || r.body != "the app says no\n" {
		t.Fatalf("the app's 403 = %d %q, want it passed through", r.code, r.body)
	}

	// The path maps to a route: variants of /api/search share its bucket
	// (search-per-user, burst 10, and per-user, burst 3, both apply).
	dan := map[string]string{"X-User-Id": "dan"}
	for _, p := range []string{"/api/search", "/api/search/users", "/api/search;v=2"} {
		if r := send(t, http.MethodGet, cd.base+p, dan); r.code != http.StatusOK {
			t.Fatalf("%s = %d %v, want 200", p, r.code, r.h)
		}
	}
	if r := send(t, http.MethodGet, cd.base+"/api/items", dan); r.code != http.StatusTooManyRequests {
		t.Fatalf("/api/items after three searches = %d, want 429 (dan's per-user budget of 3 is spent)", r.code)
	}

	// Redis down, rule fail_closed (the default): the agent's 503 with
	// Retry-After: 1 and no quota fields; the app is not called.
	a.redis.Stop()
	before := app.seen("erin", "")
	r := send(t, http.MethodGet, cd.base+"/", map[string]string{"X-User-Id": "erin"})
	if r.code != http.StatusServiceUnavailable || r.h.Get("Retry-After") != "1" || r.h.Get("RateLimit") != "" || r.h.Get("RateLimit-Policy") != "" {
		t.Fatalf("store down, fail_closed = %d %v, want 503 with Retry-After: 1 and no RateLimit fields", r.code, r.h)
	}
	if r.h.Get("X-Ration-Reason") == "" {
		t.Fatalf("store down: the 503 carries no X-Ration-Reason; want the agent's own answer, not Caddy's")
	}
	if app.seen("erin", "") != before {
		t.Fatal("the app was called while the limiter answered 503")
	}
	a.redis.Restart()

	// The agent itself down: Caddy's 502 from the check becomes 503.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.srv.Shutdown(ctx); err != nil {
		t.Fatalf("agent shutdown: %v", err)
	}
	r = send(t, http.MethodGet, cd.base+"/", map[string]string{"X-User-Id": "frank"})
	if r.code != http.StatusServiceUnavailable || r.h.Get("Retry-After") != "1" {
		t.Fatalf("agent down = %d %v, want 503 with Retry-After: 1 (fail closed)", r.code, r.h)
	}
	if app.seen("frank", "") != 0 {
		t.Fatal("the app was called while the agent was down")
	}
}
