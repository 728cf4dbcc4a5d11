package harness

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// CheckSlowLoris opens n slow-loris connections to each HTTP server
// address (a header sent one byte a second, never ended) and fails t
// unless every one is closed within 2s after timeout, the server's header
// timeout, and not more than 1s before it (its bytes are a valid header
// start: nothing but the timeout closes it); and unless, while they are
// open, GET /healthz on every address is answered 200 every half second.
func CheckSlowLoris(t testing.TB, timeout time.Duration, n int, addrs ...string) {
	t.Helper()
	const early, late = time.Second, 2 * time.Second
	var wg sync.WaitGroup
	for _, addr := range addrs {
		for range n {
			wg.Go(func() {
				d, err := slowHeaders(addr, 3*timeout)
				switch {
				case err != nil:
					t.Errorf("slow-loris connection to %s: %v", addr, err)
				case d < timeout-early || d > timeout+late:
					t.Errorf("slow-loris connection to %s closed after %v, want %v (-%v, +%v)", addr, d.Round(time.Millisecond), timeout, early, late)
				}
			})
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	defer func() { <-done }()
	client := &http.Client{Timeout: 2 * time.Second}
	for answered := 0; ; answered++ {
		select {
		case <-done:
			if answered < int(timeout/time.Second) {
				t.Errorf("%d rounds of requests answered while the slow-loris connections were open", answered)
			}
			return
		case <-time.After(500 * time.Millisecond):
		}
		for _, addr := range addrs {
			resp, err := client.Get("http://" + addr + "/healthz")
			if err != nil {
				t.Errorf("GET /healthz on %s beside the slow-loris connections: %v", addr, err)
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("GET /healthz on %s beside the slow-loris connections: %s", addr, resp.Status)
			}
		}
	}
}

// slowHeaders is a slow-loris client: it opens a TCP connection to the
// HTTP server at addr and sends a request's header one byte a second,
// never ending it. It returns how long after the connection was opened
// the server closed it (a read or a write failed: EOF or a reset), or an
// error if the connection is still open after limit.
func slowHeaders(addr string, limit time.Duration) (time.Duration, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	start := time.Now()
	closed := make(chan time.Duration, 1)
	go func() {
		// A server may answer before it closes (408); what counts is the
		// close.
		_, _ = io.Copy(io.Discard, conn)
		closed <- time.Since(start)
	}()
	// A valid header that goes on forever: the server has no reason to
	// refuse it before its timeout.
	header := "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: "
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for i := 0; ; i++ {
		b := byte('a')
		if i < len(header) {
			b = header[i]
		}
		if _, err := conn.Write([]byte{b}); err != nil {
			// The server has closed the connection (reset); the reader
			// sees it too.
			select {
			case d := <-closed:
				return d, nil
			case <-time.After(time.Second):
				return time.Since(start), nil
			}
		}
		select {
		case d := <-closed:
			return d, nil
		case <-deadline.C:
			return 0, fmt.Errorf("still open after %v, %d header bytes sent", limit, i+1)
		case <-tick.C:
		}
	}
}
