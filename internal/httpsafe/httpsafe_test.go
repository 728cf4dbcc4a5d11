package httpsafe_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ration-dev/ration/internal/httpsafe"
)

// A panicking handler is answered 500 over a real connection, logged with
// its path, and the server answers the next request; a handler that wrote
// its status first keeps it.
func TestRecoverAnswersInternal(t *testing.T) {
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	mux := http.NewServeMux()
	mux.HandleFunc("/boom", func(http.ResponseWriter, *http.Request) { panic("a bug") })
	mux.HandleFunc("/late", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		panic("after the status")
	})
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "fine") })
	srv := httptest.NewServer(httpsafe.Recover(mux, logger))
	t.Cleanup(srv.Close)

	resp, err := http.Get(srv.URL + "/boom")
	if err != nil {
		t.Fatalf("GET /boom: %v, want a 500 answer, not a cut connection", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), "internal error") {
		t.Fatalf("GET /boom = %d %q, want 500 internal error", resp.StatusCode, body)
	}
	if !strings.Contains(logs.String(), "panic in HTTP handler") || !strings.Contains(logs.String(), "path=/boom") {
		t.Errorf("log lacks the panic and its path:\n%s", logs.String())
	}
	if resp, err := http.Get(srv.URL + "/late"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Errorf("GET /late = %d, want the 202 already sent", resp.StatusCode)
		}
	}
	resp, err = http.Get(srv.URL + "/ok")
	if err != nil {
		t.Fatalf("GET /ok after the panics: %v", err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "fine" {
		t.Fatalf("GET /ok = %q", body)
	}
}
