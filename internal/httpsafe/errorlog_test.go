package httpsafe

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// A flood of net/http's connection errors becomes one Warn record per
// interval, each counting the ones it stands for.
func TestErrorLogLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		l := ErrorLog(slog.New(slog.NewTextHandler(&buf, nil)), time.Minute)
		for i := 0; i < 50; i++ {
			l.Printf("http: TLS handshake error from 127.0.0.1:%d: remote error", 40000+i)
		}
		time.Sleep(time.Minute)
		l.Printf("http: URL query contains semicolon")
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != 2 {
			t.Fatalf("%d records for 51 errors over a minute, want 2:\n%s", len(lines), buf.String())
		}
		if !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "TLS handshake error") || !strings.Contains(lines[0], "suppressed_before=0") {
			t.Fatalf("first record = %s", lines[0])
		}
		if !strings.Contains(lines[1], "semicolon") || !strings.Contains(lines[1], "suppressed_before=49") {
			t.Fatalf("second record = %s, want the 49 suppressed counted", lines[1])
		}
	})
}
