package main

import (
	"os"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// The name may hold spaces and parentheses; utime 1234 and stime 56
	// are fields 14 and 15.
	line := "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 4 0 5000 100000 200 18446744073709551615\n"
	p, err := parseProcStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if p.name != "my (odd) name" || p.cpu != (1234+56)*clockTick {
		t.Errorf("parseProcStat = %q, %v; want %q, %v", p.name, p.cpu, "my (odd) name", (1234+56)*clockTick)
	}
	for _, bad := range []string{"", "42 noparens S 1", "42 (x) S 1 2 3", "42 (x) S 1 2 3 4 5 6 7 8 9 10 abc 5 6"} {
		if _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("parseProcStat(%q) succeeded, want an error", bad)
		}
	}
}

func TestCPUWatchSelf(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	w, err := newCPUWatch([]int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	w.start()
	for deadline := time.Now().Add(50 * time.Millisecond); time.Now().Before(deadline); { // burn a little CPU
	}
	procs, self := w.finish(1000)
	if len(procs) != 1 || procs[0].Error != "" || procs[0].PID != os.Getpid() || procs[0].Seconds < 0 {
		t.Errorf("finish = %+v, want this process without error", procs)
	}
	if self == nil {
		t.Error("finish: no self CPU")
	}
	if _, err := newCPUWatch([]int{1 << 30}); err == nil {
		t.Error("newCPUWatch(missing pid) succeeded, want an error")
	}
}
