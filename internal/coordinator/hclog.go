package coordinator

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter hands hashicorp/raft's hclog output to the node's slog
// logger, so that a process has one logger, one format and one level, and
// no library writes to stderr behind the operator's back.
type hclogAdapter struct {
	logger *slog.Logger
	name   string
	args   []any
}

var _ hclog.Logger = (*hclogAdapter)(nil)

// newHclog returns an hclog.Logger writing into logger. Its level follows
// the slog handler's (Enabled), so SetLevel is a no-op: the level is the
// process's, not raft's.
func newHclog(logger *slog.Logger, name string) hclog.Logger {
	return &hclogAdapter{logger: logger, name: name}
}

// slogLevel maps hclog levels; Trace sits below slog's Debug so that a
// handler at Debug does not drown in raft's per-RPC trace lines.
func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

func (h *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	if level == hclog.Warn && startupNoise(msg, args) {
		level = hclog.Info
	}
	lvl := slogLevel(level)
	ctx := context.Background()
	if !h.logger.Enabled(ctx, lvl) {
		return
	}
	all := make([]any, 0, 2+len(h.args)+len(args))
	if h.name != "" {
		all = append(all, "component", h.name)
	}
	all = append(all, h.args...)
	all = append(all, fixArgs(args)...)
	h.logger.Log(ctx, lvl, msg, all...)
}

// startupNoise reports the warnings hashicorp/raft logs on every healthy
// start, which operators learn to ignore (and then miss the real ones):
// a node's first election, when it has never known a leader; a joining
// node's empty log, refused by the leader's first AppendEntries; and the
// leader's resending of older entries to such a node.
func startupNoise(msg string, args []any) bool {
	arg := func(key string) (any, bool) {
		for i := 0; i+1 < len(args); i += 2 {
			if k, _ := args[i].(string); k == key {
				return args[i+1], true
			}
		}
		return nil, false
	}
	switch msg {
	case "heartbeat timeout reached, starting election":
		id, ok := arg("last-leader-id")
		return ok && fmt.Sprint(id) == ""
	case "failed to get previous log":
		last, ok := arg("last-index")
		return ok && fmt.Sprint(last) == "0"
	case "appendEntries rejected, sending older logs":
		// Also a follower that fell behind: the rejection itself says
		// nothing wrong happened, the leader repairs it at once.
		return true
	}
	return false
}

// fixArgs keeps slog from printing !BADKEY for hclog's odd-length argument
// lists (hclog accepts a trailing value without a key), and formats
// hclog.Fmt values as hclog would.
func fixArgs(args []any) []any {
	out := make([]any, 0, len(args)+1)
	for i := 0; i < len(args); i += 2 {
		if i+1 == len(args) {
			out = append(out, "extra", args[i])
			break
		}
		v := args[i+1]
		if f, ok := v.(hclog.Format); ok && len(f) > 0 {
			if format, ok := f[0].(string); ok {
				v = fmt.Sprintf(format, f[1:]...)
			}
		}
		out = append(out, args[i], v)
	}
	return out
}

func (h *hclogAdapter) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hclogAdapter) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hclogAdapter) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hclogAdapter) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hclogAdapter) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *hclogAdapter) enabled(l hclog.Level) bool {
	return h.logger.Enabled(context.Background(), slogLevel(l))
}

func (h *hclogAdapter) IsTrace() bool { return h.enabled(hclog.Trace) }
func (h *hclogAdapter) IsDebug() bool { return h.enabled(hclog.Debug) }
func (h *hclogAdapter) IsInfo() bool  { return h.enabled(hclog.Info) }
func (h *hclogAdapter) IsWarn() bool  { return h.enabled(hclog.Warn) }
func (h *hclogAdapter) IsError() bool { return h.enabled(hclog.Error) }

func (h *hclogAdapter) ImpliedArgs() []any { return h.args }

func (h *hclogAdapter) With(args ...any) hclog.Logger {
	c := *h
	c.args = append(h.args[:len(h.args):len(h.args)], fixArgs(args)...)
	return &c
}

func (h *hclogAdapter) Name() string { return h.name }

func (h *hclogAdapter) Named(name string) hclog.Logger {
	c := *h
	if c.name != "" {
		c.name += "." + name
	} else {
		c.name = name
	}
	return &c
}

func (h *hclogAdapter) ResetNamed(name string) hclog.Logger {
	c := *h
	c.name = name
	return &c
}

func (h *hclogAdapter) SetLevel(hclog.Level) {}

func (h *hclogAdapter) GetLevel() hclog.Level {
	for _, l := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error} {
		if h.enabled(l) {
			return l
		}
	}
	return hclog.Off
}

func (h *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

func (h *hclogAdapter) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	lvl := slog.LevelInfo
	if opts != nil && opts.ForceLevel != hclog.NoLevel {
		lvl = slogLevel(opts.ForceLevel)
	}
	l := h.logger
	if h.name != "" {
		l = l.With("component", h.name)
	}
	return slog.NewLogLogger(l.Handler(), lvl).Writer()
}
