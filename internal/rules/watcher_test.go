package rules

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

const interval = time.Second

func rulesFile(burst int) string {
	return fmt.Sprintf("rules:\n- {name: api, match: {tenant: '*'}, burst: %d, rate: 1}\n", burst)
}

// invalidFile has two problems, so tests can see that both are logged.
const invalidFile = "rules:\n- {name: api, match: {tenant: '*'}, burst: -1, rate: 1, colour: red}\n"

// writeAtomic replaces path the way editors and config tools do: write a
// temporary file, rename it over the old one.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// recorder is a slog handler that keeps records for assertions.
type recorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

// attrs returns the value of attribute key in every record with message msg.
func (r *recorder) attrs(msg, key string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.recs {
		if rec.Message != msg {
			continue
		}
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == key {
				out = append(out, a.Value.String())
			}
			return true
		})
	}
	return out
}

// harness is a Watcher on a temporary file with its callbacks recorded.
type harness struct {
	path    string
	w       *Watcher
	log     *recorder
	changes chan *Set
	errs    chan error
}

func newHarness(t *testing.T, path string) *harness {
	t.Helper()
	initial, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{path: path, log: &recorder{}, changes: make(chan *Set, 100), errs: make(chan error, 100)}
	h.w = NewWatcher(path, initial, slog.New(h.log), interval,
		func(err error) { h.errs <- err },
		func(s *Set) { h.changes <- s })
	return h
}

// run starts Run and stops it (checking that it returns) when the test ends.
func (h *harness) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		h.w.Run(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// drain returns what the callbacks received so far.
func drain[T any](ch chan T) []T {
	var out []T
	for {
		select {
		case v := <-ch:
			out = append(out, v)
		default:
			return out
		}
	}
}

func burstOf(t *testing.T, s *Set) float64 {
	t.Helper()
	r, ok := s.Rule("api")
	if !ok {
		t.Fatal("rule api missing")
	}
	return r.Burst
}

// tick lets one poll interval pass in the bubble and waits for the poll.
func tick() {
	time.Sleep(interval)
	synctest.Wait()
}

func TestWatcherPollsForChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "rules.yaml")
		writeAtomic(t, path, rulesFile(10))
		h := newHarness(t, path)
		h.run(t)
		synctest.Wait()
		if got := drain(h.changes); len(got) != 0 {
			t.Fatalf("unchanged file reported %d changes", len(got))
		}

		writeAtomic(t, path, rulesFile(20))
		time.Sleep(interval - time.Millisecond)
		synctest.Wait()
		if b := burstOf(t, h.w.Current()); b != 10 {
			t.Fatalf("before the next poll burst = %v, want 10", b)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if b := burstOf(t, h.w.Current()); b != 20 {
			t.Fatalf("after a poll burst = %v, want 20", b)
		}
		changes := drain(h.changes)
		if len(changes) != 1 || changes[0] != h.w.Current() {
			t.Fatalf("onChange got %d sets, want the current one once", len(changes))
		}

		// The same content written again is no change.
		writeAtomic(t, path, rulesFile(20))
		tick()
		if got := drain(h.changes); len(got) != 0 {
			t.Errorf("rewriting the same content reported %d changes", len(got))
		}
		if got := h.log.attrs("rules loaded", "rules_version"); len(got) != 1 || got[0] != changes[0].Hash() {
			t.Errorf("logged rules_version %v, want [%s]", got, changes[0].Hash())
		}
	})
}

// TestWatcherRunChecksAtStart covers a change between the initial Load and
// Run: it is picked up at once, not one interval later.
func TestWatcherRunChecksAtStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "rules.yaml")
		writeAtomic(t, path, rulesFile(10))
		h := newHarness(t, path)
		writeAtomic(t, path, rulesFile(15))
		h.run(t)
		synctest.Wait()
		if b := burstOf(t, h.w.Current()); b != 15 {
			t.Fatalf("at Run's start burst = %v, want 15", b)
		}
	})
}

// TestWatcherConfigMapSwap updates the file exactly as the kubelet updates a
// mounted ConfigMap: the file is a symlink into ..data, itself a symlink to a
// timestamped directory, and an update renames a new ..data over the old.
func TestWatcherConfigMapSwap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		version := func(name, content string) {
			t.Helper()
			if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name, "rules.yaml"), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		version("..2026_01_02_03_04_05.000000001", rulesFile(10))
		mustDo(t, os.Symlink("..2026_01_02_03_04_05.000000001", filepath.Join(dir, "..data")))
		path := filepath.Join(dir, "rules.yaml")
		mustDo(t, os.Symlink(filepath.Join("..data", "rules.yaml"), path))

		h := newHarness(t, path)
		h.run(t)
		synctest.Wait()

		version("..2026_01_02_03_09_00.000000002", rulesFile(30))
		mustDo(t, os.Symlink("..2026_01_02_03_09_00.000000002", filepath.Join(dir, "..data_tmp")))
		mustDo(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
		mustDo(t, os.RemoveAll(filepath.Join(dir, "..2026_01_02_03_04_05.000000001")))
		tick()

		if b := burstOf(t, h.w.Current()); b != 30 {
			t.Fatalf("after the swap burst = %v, want 30", b)
		}
		if n := len(drain(h.changes)); n != 1 {
			t.Errorf("onChange called %d times, want 1", n)
		}
		if errs := drain(h.errs); len(errs) != 0 {
			t.Errorf("onError called during the swap: %v", errs)
		}
	})
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestWatcherInvalidEditKeepsOldSet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "rules.yaml")
		writeAtomic(t, path, rulesFile(10))
		h := newHarness(t, path)
		old := h.w.Current()
		h.run(t)
		synctest.Wait()

		writeAtomic(t, path, invalidFile)
		tick()
		if h.w.Current() != old {
			t.Fatal("an invalid file replaced the rules in force")
		}
		errs := drain(h.errs)
		if len(errs) != 1 || !errors.Is(errs[0], ErrInvalidFile) {
			t.Fatalf("onError got %v, want one ErrInvalidFile", errs)
		}
		problems := h.log.attrs("rules file problem", "error")
		if len(problems) != 2 ||
			!strings.Contains(problems[0], "rules.yaml:2:") || !strings.Contains(problems[0], "rules[0].burst") ||
			!strings.Contains(problems[1], "rules[0].colour") {
			t.Errorf("logged problems %q, want burst and colour with positions", problems)
		}
		if kept := h.log.attrs("rules file invalid; keeping the rules in force", "rules_version"); len(kept) != 1 || kept[0] != old.Hash() {
			t.Errorf("logged kept version %v, want [%s]", kept, old.Hash())
		}

		// The same bad content is reported once, not every poll.
		tick()
		tick()
		if errs := drain(h.errs); len(errs) != 0 {
			t.Errorf("the same invalid file was reported again: %v", errs)
		}

		// Reverting to the rules in force changes nothing but clears the
		// failure, so the same mistake made again is reported again.
		writeAtomic(t, path, rulesFile(10))
		tick()
		writeAtomic(t, path, invalidFile)
		tick()
		if errs := drain(h.errs); len(errs) != 1 {
			t.Errorf("repeated mistake reported %d times, want 1", len(errs))
		}

		writeAtomic(t, path, rulesFile(40))
		tick()
		if b := burstOf(t, h.w.Current()); b != 40 {
			t.Fatalf("after fixing the file burst = %v, want 40", b)
		}
		if changes := drain(h.changes); len(changes) != 1 || burstOf(t, changes[0]) != 40 {
			t.Errorf("onChange got %d sets, want only the fixed one", len(changes))
		}
	})
}

func TestWatcherFileRemoved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "rules.yaml")
		writeAtomic(t, path, rulesFile(10))
		h := newHarness(t, path)
		old := h.w.Current()
		h.run(t)
		synctest.Wait()

		mustDo(t, os.Remove(path))
		tick()
		tick()
		if h.w.Current() != old {
			t.Fatal("a missing file replaced the rules in force")
		}
		errs := drain(h.errs)
		if len(errs) != 1 || !errors.Is(errs[0], fs.ErrNotExist) {
			t.Errorf("onError got %v, want one fs.ErrNotExist", errs)
		}
	})
}

// TestWatcherReload covers the SIGHUP path: no polling, the answer at once.
func TestWatcherReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeAtomic(t, path, rulesFile(10))
	h := newHarness(t, path)

	writeAtomic(t, path, rulesFile(50))
	if err := h.w.Reload(); err != nil {
		t.Fatalf("Reload = %v", err)
	}
	if b := burstOf(t, h.w.Current()); b != 50 {
		t.Fatalf("after Reload burst = %v, want 50", b)
	}
	if n := len(drain(h.changes)); n != 1 {
		t.Errorf("onChange called %d times, want 1", n)
	}

	if err := h.w.Reload(); err != nil {
		t.Fatalf("Reload of unchanged file = %v", err)
	}
	if n := len(drain(h.changes)); n != 0 {
		t.Errorf("Reload of unchanged file called onChange %d times", n)
	}

	good := h.w.Current()
	writeAtomic(t, path, invalidFile)
	for i := range 2 { // an explicit Reload always answers, even repeated
		err := h.w.Reload()
		if !errors.Is(err, ErrInvalidFile) || !strings.Contains(err.Error(), "rules[0].burst") {
			t.Fatalf("Reload %d of invalid file = %v, want ErrInvalidFile naming rules[0].burst", i, err)
		}
		if h.w.Current() != good {
			t.Fatal("an invalid file replaced the rules in force")
		}
	}
	if n := len(drain(h.errs)); n != 2 {
		t.Errorf("onError called %d times, want 2", n)
	}
}

func TestWatcherWithoutInitialSet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	w := NewWatcher(path, nil, nil, 0, nil, nil)
	if w.Current() != nil {
		t.Fatal("Current() before any load is not nil")
	}
	if err := w.Reload(); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Reload of missing file = %v, want fs.ErrNotExist", err)
	}
	writeAtomic(t, path, rulesFile(10))
	if err := w.Reload(); err != nil {
		t.Fatalf("Reload = %v", err)
	}
	if w.Current() == nil {
		t.Fatal("Current() is nil after a valid Reload")
	}
}

// TestWatcherConcurrentUse is for the race detector: readers match against
// Current while reloads swap it.
func TestWatcherConcurrentUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeAtomic(t, path, rulesFile(1))
	h := newHarness(t, path)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 {
		wg.Go(func() {
			d := map[string]string{"tenant": "t"}
			var out []Match
			for {
				select {
				case <-stop:
					return
				default:
				}
				out = h.w.Current().Match(d, out[:0])
				if len(out) != 1 {
					t.Errorf("Match = %d rules, want 1", len(out))
					return
				}
			}
		})
	}
	for i := range 20 {
		writeAtomic(t, path, rulesFile(i+2))
		if err := h.w.Reload(); err != nil {
			t.Error(err)
		}
	}
	close(stop)
	wg.Wait()
}
