// Package httpsafe holds what every Ration HTTP server wraps its handler
// in: a panic in a handler is answered 500 and logged with its stack, in
// the process's log format. net/http recovers handler panics itself, but
// it answers nothing (the caller sees the connection close, which a
// gateway may retry as a network error) and writes the stack to the
// standard logger, outside the structured log.
package httpsafe

import (
	"errors"
	"log/slog"
	"net/http"
	"runtime/debug"
)

// Recover answers a request whose handler panics with 500 Internal Server
// Error (when nothing was written yet) and logs the panic to logger (nil:
// not logged). http.ErrAbortHandler, the way a handler aborts a response
// on purpose, passes through to net/http.
func Recover(next http.Handler, logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rw := &written{ResponseWriter: w}
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				panic(v)
			}
			if logger != nil {
				logger.Error("panic in HTTP handler", "method", r.Method, "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
			}
			if !rw.wrote {
				http.Error(w, "internal error", http.StatusInternalServerError)
			}
		}()
		next.ServeHTTP(rw, r)
	})
}

// written notes whether the status line went out: after it, a 500 cannot
// be sent, and the response is cut short instead.
type written struct {
	http.ResponseWriter
	wrote bool
}

func (w *written) WriteHeader(code int) {
	w.wrote = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *written) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer
// (flushes, deadlines).
func (w *written) Unwrap() http.ResponseWriter { return w.ResponseWriter }
