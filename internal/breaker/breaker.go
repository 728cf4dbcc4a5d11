package breaker

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// State is the breaker's position.
type State int32

const (
	Closed State = iota // calls go through
	Open                // calls are refused without touching the dependency
)

func (s State) String() string {
	if s == Open {
		return "open"
	}
	return "closed"
}

// Config tunes a breaker.
type Config struct {
	// Threshold is how many consecutive failures open the breaker.
	Threshold int
	// ProbeInterval is the pause between probes while open.
	ProbeInterval time.Duration
}

// DefaultConfig trips after 3 consecutive failures and probes every 500ms:
// a dead Redis costs at most 3 decision timeouts before decisions stop
// waiting, and a recovered one is noticed within half a second.
func DefaultConfig() Config { return Config{Threshold: 3, ProbeInterval: 500 * time.Millisecond} }

// Validate reports every problem at once.
func (c Config) Validate() error {
	if c.Threshold < 1 {
		return fmt.Errorf("breaker: threshold %d must be at least 1", c.Threshold)
	}
	if c.ProbeInterval <= 0 {
		return fmt.Errorf("breaker: probe interval %v must be positive", c.ProbeInterval)
	}
	return nil
}

// Transition describes a state change, for logs and metrics.
type Transition struct {
	From, To State
	At       time.Time
	// Since is when the state that ended began (the outage start when
	// closing).
	Since time.Time
}

// Breaker is safe for concurrent use. Allow is one atomic load on the hot
// path; the mutex is taken only when a result changes the count.
type Breaker struct {
	cfg      Config
	state    atomic.Int32
	failures atomic.Int32

	mu        sync.Mutex
	since     time.Time // when the current state began
	lastProbe time.Time
	onChange  func(Transition)
}

// New returns a closed breaker. onChange, if not nil, is called (outside any
// lock) on each state change.
func New(cfg Config, onChange func(Transition)) *Breaker {
	return &Breaker{cfg: cfg, onChange: onChange}
}

// State returns the current state.
func (b *Breaker) State() State { return State(b.state.Load()) }

// Allow reports whether a call may go to the dependency now.
func (b *Breaker) Allow() bool { return State(b.state.Load()) == Closed }

// OpenSince returns when the breaker opened, or the zero time when closed.
func (b *Breaker) OpenSince() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	if State(b.state.Load()) != Open {
		return time.Time{}
	}
	return b.since
}

// Success records a call that reached the dependency and got an answer.
func (b *Breaker) Success(now time.Time) {
	if b.failures.Load() == 0 && State(b.state.Load()) == Closed {
		return
	}
	b.failures.Store(0)
	b.setState(Closed, now)
}

// Failure records a call that could not reach the dependency in time.
func (b *Breaker) Failure(now time.Time) {
	n := b.failures.Add(1)
	if int(n) >= b.cfg.Threshold {
		b.setState(Open, now)
	}
}

// ProbeDue reports whether a prober should try the dependency now, and if so
// reserves the slot so that concurrent probers do not pile up.
func (b *Breaker) ProbeDue(now time.Time) bool {
	if State(b.state.Load()) != Open {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.lastProbe) < b.cfg.ProbeInterval {
		return false
	}
	b.lastProbe = now
	return true
}

func (b *Breaker) setState(to State, now time.Time) {
	b.mu.Lock()
	from := State(b.state.Load())
	if from == to {
		b.mu.Unlock()
		return
	}
	t := Transition{From: from, To: to, At: now, Since: b.since}
	b.state.Store(int32(to))
	b.since = now
	if to == Open {
		// The first probe waits a full interval: the failures that opened
		// the breaker just happened.
		b.lastProbe = now
	}
	b.mu.Unlock()
	if b.onChange != nil {
		b.onChange(t)
	}
}
