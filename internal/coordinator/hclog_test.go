package coordinator

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// TestHclogAdapter: raft's hclog calls land in the slog logger at the
// mapped level, with the logger's name and arguments, and below the
// handler's level they are dropped.
func TestHclogAdapter(t *testing.T) {
	var buf bytes.Buffer
	l := newHclog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})), "raft")
	tests := []struct {
		log  func()
		want string // "" = nothing written
	}{
		{func() { l.Info("entering follower state", "leader-id", "n1") }, `level=INFO msg="entering follower state" component=raft leader-id=n1`},
		{func() { l.Named("snapshot").Warn("slow", "took", 3) }, `level=WARN msg=slow component=raft.snapshot took=3`},
		{func() { l.With("peer", "n2").Error("failed", "err", "EOF") }, `level=ERROR msg=failed component=raft peer=n2 err=EOF`},
		{func() { l.Error("odd", "lonely") }, `level=ERROR msg=odd component=raft extra=lonely`},
		// A healthy start's warnings are information; the same after a
		// leader was known, or with entries in the log, are warnings.
		{func() {
			l.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "", "last-leader-id", "")
		},
			`level=INFO msg="heartbeat timeout reached, starting election" component=raft last-leader-addr="" last-leader-id=""`},
		{func() {
			l.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "a:1", "last-leader-id", "n1")
		},
			`level=WARN msg="heartbeat timeout reached, starting election" component=raft last-leader-addr=a:1 last-leader-id=n1`},
		{func() {
			l.Warn("failed to get previous log", "previous-index", uint64(7), "last-index", uint64(0), "error", "log not found")
		},
			`level=INFO msg="failed to get previous log" component=raft previous-index=7 last-index=0 error="log not found"`},
		{func() {
			l.Warn("failed to get previous log", "previous-index", uint64(7), "last-index", uint64(5), "error", "log not found")
		},
			`level=WARN msg="failed to get previous log" component=raft previous-index=7 last-index=5 error="log not found"`},
		{func() { l.Debug("hidden") }, ""},
		{func() { l.Trace("hidden") }, ""},
	}
	for _, tc := range tests {
		buf.Reset()
		tc.log()
		got := strings.TrimSpace(buf.String())
		if tc.want == "" {
			if got != "" {
				t.Errorf("wrote %q below the handler's level", got)
			}
			continue
		}
		if !strings.HasSuffix(got, tc.want) {
			t.Errorf("wrote %q, want it to end with %q", got, tc.want)
		}
	}
	if !l.IsInfo() || l.IsDebug() || l.GetLevel() != hclog.Info {
		t.Errorf("levels: IsInfo %v IsDebug %v GetLevel %v; want true false Info", l.IsInfo(), l.IsDebug(), l.GetLevel())
	}
	buf.Reset()
	l.StandardLogger(nil).Print("from the standard logger")
	if !strings.Contains(buf.String(), `msg="from the standard logger" component=raft`) {
		t.Errorf("standard logger wrote %q", buf.String())
	}
}
