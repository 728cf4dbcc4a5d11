package goclient_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/client"
	"github.com/ration-dev/ration/client/header"
)

const middlewareRules = `
rules:
  - name: per-user
    match: {user: "*"}
    burst: 2
    rate: 1/h
`

// byUser limits by the X-User-Id header and leaves /healthz unchecked.
func byUser(r *http.Request) (client.Request, bool) {
	if r.URL.Path == "/healthz" {
		return client.Request{}, false
	}
	return client.Request{Descriptors: map[string]string{"user": r.Header.Get("X-User-Id")}}, true
}

type served struct {
	calls atomic.Int64
	mu    sync.Mutex
	err   error // last error given to OnError
}

func (s *served) handler(opts client.MiddlewareOptions, c client.Allower) http.Handler {
	opts.OnError = func(_ *http.Request, err error) {
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
	}
	return client.Middleware(c, byUser, opts)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.calls.Add(1)
		w.Header().Set("X-Handler", "yes")
		_, _ = w.Write([]byte("ok"))
	}))
}

func (s *served) lastErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func do(h http.Handler, path, userID string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if userID != "" {
		req.Header.Set("X-User-Id", userID)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func rateLimitR(t *testing.T, rec *httptest.ResponseRecorder) int64 {
	t.Helper()
	items, err := header.ParseRateLimit(rec.Header().Get("RateLimit"))
	if err != nil || len(items) != 1 || items[0].Name != "per-user" {
		t.Fatalf("RateLimit = %q (%v), want one per-user member", rec.Header().Get("RateLimit"), err)
	}
	return items[0].Remaining
}

// Against a real agent and redis-server: admitted requests reach the
// handler with the quota fields; then 429 with Retry-After, the handler not
// called; 503 when the store is down (fail_closed) and when the agent is
// down, unless FailOpen.
func TestMiddleware(t *testing.T) {
	srv, r := startAgent(t, middlewareRules)
	// Well above the agent's decision timeout (500ms here): every answer
	// below is the agent's own decision, never this client giving up.
	c := newClient(t, srv.GRPCAddr(), client.Options{Timeout: 10 * time.Second})
	var s served
	h := s.handler(client.MiddlewareOptions{}, c)

	for i := 0; i < 2; i++ {
		rec := do(h, "/search", "alice")
		if rec.Code != 200 || rec.Header().Get("X-Handler") != "yes" {
			t.Fatalf("request %d = %d %v, want 200 from the handler", i, rec.Code, rec.Header())
		}
		if got := rec.Header().Get("RateLimit-Policy"); got != `"per-user";q=2;w=7200` {
			t.Fatalf("request %d RateLimit-Policy = %q", i, got)
		}
		if got := rateLimitR(t, rec); got != int64(1-i) {
			t.Fatalf("request %d RateLimit r = %d, want %d", i, got, 1-i)
		}
	}
	rec := do(h, "/search", "alice")
	if rec.Code != http.StatusTooManyRequests || s.calls.Load() != 2 {
		t.Fatalf("3rd = %d (handler calls %d), want 429 and the handler not called", rec.Code, s.calls.Load())
	}
	if ra, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || ra < 1 || ra > 3600 {
		t.Fatalf("Retry-After = %q, want 1..3600", rec.Header().Get("Retry-After"))
	}
	if rateLimitR(t, rec) != 0 || rec.Header().Get("RateLimit-Policy") == "" {
		t.Fatalf("429 fields = %v, want r=0 and the policy", rec.Header())
	}
	// Unchecked paths pass, spent budget or not.
	if rec := do(h, "/healthz", "alice"); rec.Code != 200 || rec.Header().Get("RateLimit") != "" {
		t.Fatalf("/healthz = %d %v, want 200 unchecked", rec.Code, rec.Header())
	}
	// A value the agent rejects (over 256 bytes): 400, reported to OnError.
	if rec := do(h, "/search", strings.Repeat("u", 300)); rec.Code != http.StatusBadRequest || !errors.Is(s.lastErr(), client.ErrInvalid) {
		t.Fatalf("oversized user = %d (OnError %v), want 400 and ErrInvalid", rec.Code, s.lastErr())
	}

	// The store down, rule fail_closed: the agent decides 503 (no error on
	// this side), answered with Retry-After: 1 and no quota fields.
	r.Stop()
	var decided served
	rec = do(decided.handler(client.MiddlewareOptions{}, c), "/search", "bob")
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" || rec.Header().Get("RateLimit") != "" || decided.calls.Load() != 0 {
		t.Fatalf("store down = %d %v, want 503 with Retry-After: 1, no RateLimit, handler not called", rec.Code, rec.Header())
	}
	if err := decided.lastErr(); err != nil {
		t.Fatalf("store down: the call failed (%v); want the agent's fail_closed decision", err)
	}
	// (With Redis back, the agent shuts down at once; with it down, its
	// shutdown waits on the store client.)
	r.Restart()

	// The agent down: 503 by default, the handler with FailOpen.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	rec = do(h, "/search", "carol")
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" || !errors.Is(s.lastErr(), client.ErrUnavailable) {
		t.Fatalf("agent down = %d %v (OnError %v), want 503 with Retry-After: 1 and ErrUnavailable", rec.Code, rec.Header(), s.lastErr())
	}
	var open served
	rec = do(open.handler(client.MiddlewareOptions{FailOpen: true}, c), "/search", "carol")
	if rec.Code != 200 || open.calls.Load() != 1 || !errors.Is(open.lastErr(), client.ErrUnavailable) {
		t.Fatalf("agent down, FailOpen = %d (handler calls %d), want 200 from the handler", rec.Code, open.calls.Load())
	}
}

// The middleware writes what the agent's own check endpoint writes for the
// same history: status, RateLimit-Policy, RateLimit and Retry-After.
func TestMiddlewareMatchesCheckEndpoint(t *testing.T) {
	srv, _ := startAgent(t, middlewareRules)
	c := newClient(t, srv.GRPCAddr(), client.Options{Timeout: 10 * time.Second})
	var s served
	h := s.handler(client.MiddlewareOptions{}, c)
	for i := 0; i < 3; i++ {
		mw := do(h, "/search", "ivan")
		resp, err := http.Get("http://" + srv.HTTPAddr() + "/v1/check?user=judy")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if mw.Code != resp.StatusCode {
			t.Fatalf("request %d: middleware %d, check endpoint %d", i, mw.Code, resp.StatusCode)
		}
		for _, name := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
			if m, e := mw.Header().Get(name), resp.Header.Get(name); m != e {
				t.Errorf("request %d %s: middleware %q, check endpoint %q", i, name, m, e)
			}
		}
	}
}
