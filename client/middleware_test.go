package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ration-dev/ration/client"
	"github.com/ration-dev/ration/client/clienttest"
	"github.com/ration-dev/ration/client/header"
)

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

// The response fields for every kind of decision, written through the
// header code exactly as the agent's check endpoint writes them.
func TestMiddlewareDecisionMapping(t *testing.T) {
	tests := []struct {
		name       string
		d          client.Decision
		code       int
		retryAfter string
		quota      bool
	}{
		{"admitted", client.Decision{Allowed: true, Rule: "r", Limit: 5, Rate: 1, Remaining: 4, Reset: time.Second, Reason: client.ReasonOK}, 200, "", true},
		{"no rule", client.Decision{Allowed: true, Reason: client.ReasonNoRule}, 200, "", false},
		{"fail_open", client.Decision{Allowed: true, Rule: "r", Limit: 5, Reason: client.ReasonUnavailable}, 200, "", false},
		{"over limit", client.Decision{Rule: "r", Limit: 5, Rate: 1, RetryAfter: 1500 * time.Millisecond, Reason: client.ReasonOverLimit}, 429, "2", true},
		{"over limit, rate 0", client.Decision{Rule: "r", Limit: 5, Reason: client.ReasonOverLimit}, 429, "", true},
		{"emergency denial", client.Decision{Rule: "r", Limit: 5, Rate: 1, RetryAfter: time.Second, Reason: client.ReasonEmergency}, 429, "1", true},
		{"fail_closed", client.Decision{Rule: "r", Limit: 5, Reason: client.ReasonUnavailable}, 503, "1", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s served
			rec := do(s.handler(client.MiddlewareOptions{}, clienttest.New(clienttest.Fixed(tt.d))), "/", "u")
			if rec.Code != tt.code || rec.Header().Get("Retry-After") != tt.retryAfter || (rec.Header().Get("RateLimit") != "") != tt.quota {
				t.Fatalf("%+v -> %d %v, want %d, Retry-After %q, quota fields %v", tt.d, rec.Code, rec.Header(), tt.code, tt.retryAfter, tt.quota)
			}
			if called := s.calls.Load() == 1; called != (tt.code == 200) {
				t.Fatalf("handler called = %v for %d", called, rec.Code)
			}
		})
	}
}

// Failed calls: 400 for a request the agent rejects, 503 (or the handler,
// with FailOpen) when no decision could be had; every one told to OnError.
// Unchecked paths pass whatever the limiter says.
func TestMiddlewareErrors(t *testing.T) {
	fake := clienttest.New(clienttest.Bucket("per-user", 2, 1.0/3600, nil))
	var s served
	h := s.handler(client.MiddlewareOptions{}, fake)
	for i := 0; i < 2; i++ {
		if rec := do(h, "/search", "alice"); rec.Code != 200 || rec.Header().Get("X-Handler") != "yes" {
			t.Fatalf("request %d = %d, want 200 from the handler", i, rec.Code)
		}
	}
	rec := do(h, "/search", "alice")
	if rec.Code != http.StatusTooManyRequests || s.calls.Load() != 2 || rec.Header().Get("Retry-After") != "3600" {
		t.Fatalf("3rd = %d %v (handler calls %d), want 429 with Retry-After: 3600 and the handler not called", rec.Code, rec.Header(), s.calls.Load())
	}
	items, err := header.ParseRateLimit(rec.Header().Get("RateLimit"))
	if err != nil || len(items) != 1 || items[0].Name != "per-user" || items[0].Remaining != 0 {
		t.Fatalf("RateLimit = %q (%v), want per-user with r=0", rec.Header().Get("RateLimit"), err)
	}
	if rec := do(h, "/healthz", "alice"); rec.Code != 200 || rec.Header().Get("RateLimit") != "" {
		t.Fatalf("/healthz = %d %v, want 200 unchecked", rec.Code, rec.Header())
	}

	fake.SetDecide(func(client.Request) (client.Decision, error) {
		return client.Decision{}, client.ErrInvalid
	})
	if rec := do(h, "/search", strings.Repeat("u", 300)); rec.Code != http.StatusBadRequest || !errors.Is(s.lastErr(), client.ErrInvalid) {
		t.Fatalf("invalid = %d (OnError %v), want 400 and ErrInvalid", rec.Code, s.lastErr())
	}

	fake.SetDecide(clienttest.Unavailable())
	if rec := do(h, "/search", "carol"); rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" || !errors.Is(s.lastErr(), client.ErrUnavailable) {
		t.Fatalf("agent down = %d %v (OnError %v), want 503 with Retry-After: 1 and ErrUnavailable", rec.Code, rec.Header(), s.lastErr())
	}
	var open served
	if rec := do(open.handler(client.MiddlewareOptions{FailOpen: true}, fake), "/search", "carol"); rec.Code != 200 || open.calls.Load() != 1 || !errors.Is(open.lastErr(), client.ErrUnavailable) {
		t.Fatalf("agent down, FailOpen = %d (handler calls %d), want 200 from the handler", rec.Code, open.calls.Load())
	}

	// The client went away: no decision, nothing served.
	var gone served
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequest(http.MethodGet, "/search", nil).WithContext(ctx)
	w := httptest.NewRecorder()
	gone.handler(client.MiddlewareOptions{FailOpen: true}, clienttest.New(nil)).ServeHTTP(w, r)
	if w.Code != http.StatusServiceUnavailable || gone.calls.Load() != 0 || !errors.Is(gone.lastErr(), context.Canceled) {
		t.Fatalf("canceled request = %d (handler calls %d, OnError %v), want 503, the handler not called, context.Canceled", w.Code, gone.calls.Load(), gone.lastErr())
	}
}
