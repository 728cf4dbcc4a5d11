package logformat

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// RepeatedKey is the attribute of the line that stands for the records of
// one message held back in the past minute: repeated=N, N of them.
const RepeatedKey = "repeated"

// RuleKey is the attribute that names a rule. Records of one message about
// different rules are limited apart: one rule's failure, written, must not
// hold back the first line about another's.
const RuleKey = "rule"

// CauseKey is the attribute that names what went wrong, where one message
// stands for failures of different causes: records of one message with
// different causes are limited apart, so that a second, different cause
// within the window is written at once (a certificate refused for
// another reason than the last).
const CauseKey = "cause"

const (
	// repeatWindow is how long a warning or error, once written, holds
	// back its repeats.
	repeatWindow = time.Minute
	// maxRepeatMessages bounds the messages whose repeats are held back at
	// once; past it, another message is written every time until a window
	// ends.
	maxRepeatMessages = 1024
)

// limitRepeats returns a handler that writes records below Warn to next
// unchanged, and writes a warning or error at most once a window per
// message (its text and level, and its RuleKey and CauseKey attributes if
// it has them, whatever its other attributes): the first is
// written, and repeats within the window are held back. When the window
// ends with repeats held back, one line stands for them: the last one's
// attributes and time of writing, with RepeatedKey set to how many there
// were, and a new window starts; a window that ends with none ends the
// holding back. A store or a coordinator that is down would otherwise
// write the same error for every decision.
func limitRepeats(next slog.Handler, window time.Duration, maxMessages int) slog.Handler {
	return &repeatHandler{next: next, t: &repeatTable{window: window, max: maxMessages, m: map[repeatKey]*repeatEntry{}}}
}

type repeatHandler struct {
	next slog.Handler
	t    *repeatTable // shared by every handler derived by WithAttrs or WithGroup
}

type repeatKey struct {
	level slog.Level
	msg   string
	rule  string // the RuleKey attribute, "" without one
	cause string // the CauseKey attribute, "" without one
}

// repeatEntry is one message in its window.
type repeatEntry struct {
	held int          // repeats held back in this window
	last slog.Record  // the last of them
	next slog.Handler // and the handler it came through (its attributes and groups)
}

type repeatTable struct {
	window time.Duration
	max    int
	mu     sync.Mutex
	m      map[repeatKey]*repeatEntry
}

func (h *repeatHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *repeatHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &repeatHandler{next: h.next.WithAttrs(as), t: h.t}
}

func (h *repeatHandler) WithGroup(name string) slog.Handler {
	return &repeatHandler{next: h.next.WithGroup(name), t: h.t}
}

func (h *repeatHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.next.Handle(ctx, r)
	}
	k := repeatKey{level: r.Level, msg: r.Message}
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case RuleKey:
			k.rule = a.Value.String()
		case CauseKey:
			k.cause = a.Value.String()
		}
		return true
	})
	t := h.t
	t.mu.Lock()
	if e, ok := t.m[k]; ok {
		e.held++
		e.last, e.next = r.Clone(), h.next
		t.mu.Unlock()
		return nil
	}
	if len(t.m) < t.max {
		t.m[k] = &repeatEntry{}
		time.AfterFunc(t.window, func() { t.end(k) })
	}
	t.mu.Unlock()
	return h.next.Handle(ctx, r)
}

// end ends k's window.
func (t *repeatTable) end(k repeatKey) {
	t.mu.Lock()
	e := t.m[k]
	if e.held == 0 {
		delete(t.m, k)
		t.mu.Unlock()
		return
	}
	r, next, n := e.last, e.next, e.held
	e.held, e.last, e.next = 0, slog.Record{}, nil
	time.AfterFunc(t.window, func() { t.end(k) })
	t.mu.Unlock()
	r.Time = time.Now()
	r.AddAttrs(slog.Int(RepeatedKey, n))
	_ = next.Handle(context.Background(), r)
}
