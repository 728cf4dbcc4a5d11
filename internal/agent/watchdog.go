package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// watchdog tells a wedged agent from a busy one, for /healthz: a decision
// that has been in flight for longer than the stall limit, or a lease loop
// that has not stepped for that long, means the process no longer does
// its job, and an orchestrator should restart it. Every decision is
// bounded (the decision timeout bounds each wait on the store or a first
// grant), so nothing healthy lasts that long.
//
// In-flight decisions are counted by the tick they began in, in a ring of
// slots: begin adds one to the current tick's slot and end takes it away.
// When the ring comes round to a slot again, whatever it still holds began
// at least len(slots)-1 ticks ago: stuck. A slot is reused even then (its
// stuck count stays in it, and is seen again each time round), so begin
// and end cost one atomic add each and never allocate.
type watchdog struct {
	tick  time.Duration
	slots []atomic.Int64
	epoch atomic.Int64

	// stepped, when set, is the lease loop's last step (holder.Leases).
	stepped func() time.Time
	stall   time.Duration

	logger *slog.Logger
	onSet  func(wedged bool) // metrics; called on every change

	mu      sync.Mutex
	stuckAt int64 // tick at which stuck decisions were last seen, -1: never
	cause   string
}

// newWatchdog makes a watchdog that calls decisions stuck after stall, and
// a lease loop (stepped, may be nil) stuck when it has not stepped for
// stall. tick is its resolution.
func newWatchdog(stall, tick time.Duration, stepped func() time.Time, logger *slog.Logger, onSet func(bool)) *watchdog {
	n := int(stall/tick) + 1
	if stall%tick != 0 {
		n++
	}
	return &watchdog{tick: tick, slots: make([]atomic.Int64, n), stepped: stepped, stall: stall, logger: logger, onSet: onSet, stuckAt: -1}
}

// begin counts a decision in flight; its result goes to end.
func (w *watchdog) begin() int64 {
	e := w.epoch.Load()
	w.slots[e%int64(len(w.slots))].Add(1)
	return e
}

// end counts the decision begun at e as complete.
func (w *watchdog) end(e int64) {
	w.slots[e%int64(len(w.slots))].Add(-1)
}

// run advances the ring every tick until ctx is done.
func (w *watchdog) run(ctx context.Context) {
	t := time.NewTicker(w.tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			w.step(now)
		}
	}
}

// step moves to the next tick and looks at the slot it reuses.
func (w *watchdog) step(now time.Time) {
	next := w.epoch.Load() + 1
	stuck := w.slots[next%int64(len(w.slots))].Load()
	w.epoch.Store(next)

	w.mu.Lock()
	defer w.mu.Unlock()
	if stuck > 0 {
		w.stuckAt = next
	}
	cause := ""
	if w.stuckAt >= 0 && next-w.stuckAt < int64(len(w.slots)) {
		cause = fmt.Sprintf("decisions in flight for more than %v", w.stall)
	}
	if w.stepped != nil {
		if at := w.stepped(); !at.IsZero() && now.Sub(at) > w.stall {
			if cause != "" {
				cause += "; "
			}
			cause += fmt.Sprintf("the lease renewal loop has not stepped for %v", now.Sub(at).Round(time.Millisecond))
		}
	}
	wedged := cause != ""
	if wedged != (w.cause != "") {
		if wedged {
			w.logger.Error("agent wedged: /healthz fails until it recovers", "cause", cause)
		} else {
			w.logger.Info("agent recovered: /healthz ok", "was", w.cause)
		}
		if w.onSet != nil {
			w.onSet(wedged)
		}
	}
	w.cause = cause
}

// wedged is the cause of a wedge, "" while the agent does its job.
func (w *watchdog) wedged() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cause
}
