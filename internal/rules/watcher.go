package rules

import (
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultInterval is how often a Watcher polls when given no interval.
const DefaultInterval = time.Second

// Watcher keeps the current *Set and reloads it when the file's content
// changes or when Reload is called (on SIGHUP).
//
// It polls the content rather than watching inotify events: a content
// hash sees every way a file can change (Kubernetes ConfigMap symlink
// swaps, editors that write a new file and rename it, bind mounts), where
// events on the path miss some of them.
//
// An invalid or unreadable file is logged (every problem) and reported to
// onError, and the old Set keeps serving; onChange only ever sees valid Sets.
// While polling, one failure is reported once, not every interval; Reload
// always reports.
type Watcher struct {
	filename string
	logger   *slog.Logger
	interval time.Duration
	onError  func(error)
	onChange func(*Set)

	current atomic.Pointer[Set]

	mu         sync.Mutex // serializes reloads and callbacks
	lastFailed string     // the failure last reported by a poll; "" when none
}

// NewWatcher returns a Watcher serving initial (which may be nil if no valid
// file has been loaded yet; Current then returns nil until one is). interval
// <= 0 means DefaultInterval; a nil logger discards; nil callbacks are
// skipped. Callbacks run on the reloading goroutine one at a time, in the
// order of the changes, and must not call Reload.
func NewWatcher(filename string, initial *Set, logger *slog.Logger, interval time.Duration, onError func(error), onChange func(*Set)) *Watcher {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if interval <= 0 {
		interval = DefaultInterval
	}
	w := &Watcher{filename: filename, logger: logger, interval: interval, onError: onError, onChange: onChange}
	w.current.Store(initial)
	return w
}

// Current returns the Set in force. It is one atomic load: call it per
// decision rather than caching the Set.
func (w *Watcher) Current() *Set { return w.current.Load() }

// Reload reads the file now and swaps in its rules if the content changed.
// It returns the read or parse error, if any; the old Set then stays.
func (w *Watcher) Reload() error { return w.reload(false) }

// Run polls every interval until ctx is done, starting with one poll so that
// a change between the initial load and Run is not missed.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		_ = w.reload(true)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (w *Watcher) reload(poll bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	old := w.current.Load()
	data, err := readFile(w.filename)
	if err != nil {
		w.fail(poll, "read:"+err.Error(), old, err)
		return err
	}
	digest := sha256.Sum256(data)
	if old != nil && digest == old.digest {
		if w.lastFailed != "" {
			w.logger.Info("rules file matches the rules in force again", "file", w.filename, "rules_version", old.Hash())
			w.lastFailed = ""
		}
		return nil
	}
	set, err := Parse(w.filename, data)
	if err != nil {
		w.fail(poll, "parse:"+string(digest[:]), old, err)
		return err
	}
	w.lastFailed = ""
	w.current.Store(set)
	attrs := []any{"file", w.filename, "rules_version", set.Hash(), "rules", len(set.rules)}
	if old != nil {
		attrs = append(attrs, "previous_rules_version", old.Hash())
	}
	w.logger.Info("rules loaded", attrs...)
	if w.onChange != nil {
		w.onChange(set)
	}
	return nil
}

// fail logs err, one record per problem so each is searchable, and reports
// it, unless a poll already reported this same failure (same read error, or
// same invalid content).
func (w *Watcher) fail(poll bool, key string, old *Set, err error) {
	if poll && key == w.lastFailed {
		return
	}
	w.lastFailed = key
	kept := "none"
	if old != nil {
		kept = old.Hash()
	}
	problems := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		problems = j.Unwrap()
	}
	for _, p := range problems {
		w.logger.Error("rules file problem", "file", w.filename, "error", p.Error())
	}
	msg := "rules file unreadable; keeping the rules in force"
	if errors.Is(err, ErrInvalidFile) {
		msg = "rules file invalid; keeping the rules in force"
	}
	w.logger.Error(msg, "file", w.filename, "problems", len(problems), "rules_version", kept)
	if w.onError != nil {
		w.onError(err)
	}
}
