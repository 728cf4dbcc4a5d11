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
