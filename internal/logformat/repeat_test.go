package logformat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// lockedBuffer is the log's output, written by the logger's callers and by
// the window timers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// lines returns the lines written since the last call.
func (b *lockedBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := strings.TrimSuffix(b.b.String(), "\n")
	b.b.Reset()
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func wantLines(t *testing.T, when string, got []string, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d lines, want %d:\n%s", when, len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.Contains(got[i], want[i]) {
			t.Fatalf("%s: line %d = %q, want it to contain %q", when, i, got[i], want[i])
		}
	}
}

// An error is written once; its repeats within the minute are held back
// and one line with repeated=N, the last one's attributes and the time of
// writing stands for them when the minute ends, which starts another
// minute; a minute with no repeat ends the holding back. Info is never
// held back, and a warning of the same text is a message of its own.
func TestRepeatsHeldBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out lockedBuffer
		l := New(&out, Text, slog.LevelInfo)
		start := time.Now()
		l.Error("store down", "err", "e0")
		for i := 1; i <= 10; i++ {
			time.Sleep(time.Second)
			l.Error("store down", "err", fmt.Sprint("e", i))
			l.Info("decided", "n", i)
		}
		l.Warn("store down", "err", "w")
		lines := out.lines()
		wantLines(t, "in the first minute", []string{lines[0], lines[1], lines[10], lines[11]},
			`level=ERROR msg="store down" err=e0`, `level=INFO msg=decided n=1`, `level=INFO msg=decided n=10`, `level=WARN msg="store down" err=w`)
		if len(lines) != 12 {
			t.Fatalf("in the first minute: %d lines, want 12 (1 error, 10 info, 1 warning):\n%s", len(lines), strings.Join(lines, "\n"))
		}

		time.Sleep(time.Minute - 10*time.Second)
		synctest.Wait()
		got := out.lines()
		wantLines(t, "at the end of the minute", got, `level=ERROR msg="store down" err=e10 repeated=10`)
		if at := "time=" + start.Add(time.Minute).Format("2006-01-02T15:04:05.000Z07:00"); !strings.HasPrefix(got[0], at) {
			t.Errorf("the summary %q is not stamped %s, when it is written", got[0], at)
		}

		// Another minute of holding back started with the summary.
		time.Sleep(time.Second)
		l.Error("store down", "err", "e11")
		wantLines(t, "in the second minute", out.lines())
		time.Sleep(time.Minute)
		synctest.Wait()
		wantLines(t, "at the end of the second minute", out.lines(), `msg="store down" err=e11 repeated=1`)
		// The third minute passes quiet: the next error is written at once.
		time.Sleep(time.Minute)
		synctest.Wait()
		l.Error("store down", "err", "e12")
		got = out.lines()
		wantLines(t, "after a quiet minute", got, `level=ERROR msg="store down" err=e12`)
		if strings.Contains(got[0], RepeatedKey) {
			t.Errorf("%q, written in full, says %s", got[0], RepeatedKey)
		}
	})
}

// The key is the message and its level, not the logger's attributes: the
// summary goes through the handler of the last repeat (its attributes and
// groups), and WithAttrs and WithGroup keep working. JSON gets a number.
func TestRepeatsAcrossDerivedLoggers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out lockedBuffer
		l := New(&out, JSON, slog.LevelInfo)
		l.With("component", "a").Error("lease renewal failing", "quota", "q1")
		l.With("component", "b").Error("lease renewal failing", "quota", "q2")
		l.With("component", "b").Error("lease renewal failing", "quota", "q3")
		l.WithGroup("g").Warn("slow", "k", 1)
		got := out.lines()
		if len(got) != 2 {
			t.Fatalf("%d lines, want 2:\n%s", len(got), strings.Join(got, "\n"))
		}
		var first, group map[string]any
		if err := json.Unmarshal([]byte(got[0]), &first); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(got[1]), &group); err != nil {
			t.Fatal(err)
		}
		if first["component"] != "a" || first["quota"] != "q1" || first[RepeatedKey] != nil {
			t.Errorf("first line = %v", first)
		}
		if g, _ := group["g"].(map[string]any); g == nil || g["k"] != 1.0 {
			t.Errorf("grouped line = %v, want g.k = 1", group)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		got = out.lines()
		if len(got) != 1 {
			t.Fatalf("after the minute: %d lines, want 1:\n%s", len(got), strings.Join(got, "\n"))
		}
		var sum map[string]any
		if err := json.Unmarshal([]byte(got[0]), &sum); err != nil {
			t.Fatal(err)
		}
		if sum["msg"] != "lease renewal failing" || sum["level"] != "ERROR" || sum["component"] != "b" || sum["quota"] != "q3" || sum[RepeatedKey] != 2.0 {
			t.Errorf("summary = %v, want the last repeat's attributes and repeated 2", sum)
		}
	})
}

// Past the table's bound, a new message is written every time: a flood of
// distinct messages is never held back, and the table stays bounded.
func TestRepeatTableBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out lockedBuffer
		l := slog.New(limitRepeats(slog.NewTextHandler(&out, nil), time.Minute, 2))
		for range 3 {
			l.Error("a")
			l.Error("b")
			l.Error("c")
		}
		wantLines(t, "with a full table", out.lines(), "msg=a", "msg=b", "msg=c", "msg=c", "msg=c")
		time.Sleep(time.Minute)
		synctest.Wait()
		got := out.lines()
		slices.Sort(got) // the two windows end at one instant
		wantLines(t, "after the minute", got, "msg=a repeated=2", "msg=b repeated=2")
	})
}

// Many goroutines logging one error at once: one line, then one summary
// that counts every other record (run with -race).
func TestRepeatsConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out lockedBuffer
		l := New(&out, Text, slog.LevelInfo)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				lg := l.With("g", g)
				for range 100 {
					lg.Error("redis call failed")
					lg.Info("decided")
				}
			})
		}
		wg.Wait()
		got := out.lines()
		var errs int
		for _, s := range got {
			if strings.Contains(s, "level=ERROR") {
				errs++
			}
		}
		if errs != 1 || len(got) != 801 {
			t.Fatalf("%d error lines of %d, want 1 of 801", errs, len(got))
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		wantLines(t, "after the minute", out.lines(), "repeated=799")
	})
}

// One message about two rules is two messages: the first line about the
// second rule is written at once, and only each rule's own repeats are
// held back (a failure policy taking over for one rule must not hide that
// another's did too).
func TestRepeatsHeldBackPerRule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out lockedBuffer
		l := New(&out, Text, slog.LevelInfo)
		l.Warn("failure policy activated", RuleKey, "a", "n", 1)
		l.Warn("failure policy activated", RuleKey, "b", "n", 2)
		l.Warn("failure policy activated", RuleKey, "a", "n", 3)
		l.Warn("failure policy activated", "n", 4)
		wantLines(t, "at once", out.lines(),
			`rule=a n=1`, `rule=b n=2`, `msg="failure policy activated" n=4`)
		time.Sleep(time.Minute)
		synctest.Wait()
		wantLines(t, "at the end of the minute", out.lines(), `rule=a n=3 repeated=1`)
	})
}

// One message with two causes is two messages: a reload refused for
// another reason than the last is written at once.
func TestRepeatsHeldBackPerCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out lockedBuffer
		l := New(&out, Text, slog.LevelInfo)
		l.Error("TLS files could not be reloaded", CauseKey, "expired", "n", 1)
		l.Error("TLS files could not be reloaded", CauseKey, "another agent's", "n", 2)
		l.Error("TLS files could not be reloaded", CauseKey, "expired", "n", 3)
		wantLines(t, "at once", out.lines(), `cause=expired n=1`, `cause="another agent's" n=2`)
		time.Sleep(time.Minute)
		synctest.Wait()
		wantLines(t, "at the end of the minute", out.lines(), `cause=expired n=3 repeated=1`)
	})
}
