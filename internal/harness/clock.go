package harness

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// RedisClock is a redis-server's wall clock set off from the machine's by
// an offset the test changes while the server runs (Set): a server whose
// clock steps forward or back, as NTP or an operator steps a host's. The
// server reads TIME, stamps buckets and ends TTLs by it; its monotonic
// clock (timers, timeouts) is left alone.
//
// It is an LD_PRELOAD shim of our own (clockShim, compiled with the
// system's C compiler in each test that asks for it): libfaketime, the maintained library
// for this, cannot start Debian's redis-server (its jemalloc calls
// clock_gettime while libfaketime initialises, and libfaketime gives up
// on the recursion). The shim reads the offset from a file it maps, so a
// change is seen by the server's next clock read.
type RedisClock struct {
	path string // the offset, 8 bytes: little-endian int64 nanoseconds

	mu     sync.Mutex
	offset time.Duration
}

// clockShim replaces the wall-clock reads redis-server makes. It
// allocates nothing and calls no dynamic loader (jemalloc calls
// clock_gettime from inside malloc): the kernel's clock is read by
// syscall, and the offset file is mapped at the first read.
const clockShim = `#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *offset_ns;
static int state; /* 0: not yet mapped, 1: mapped, 2: no file */

static int64_t offset(void) {
	int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
	if (s == 0) {
		const char *path = getenv("RATION_CLOCK_FILE");
		int fd = path ? open(path, O_RDONLY) : -1;
		void *p = MAP_FAILED;
		if (fd >= 0) {
			p = mmap(0, 8, PROT_READ, MAP_SHARED, fd, 0);
			close(fd);
		}
		if (p != MAP_FAILED) offset_ns = p;
		s = p != MAP_FAILED ? 1 : 2;
		__atomic_store_n(&state, s, __ATOMIC_RELEASE);
	}
	return s == 1 ? __atomic_load_n(offset_ns, __ATOMIC_RELAXED) : 0;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
	long r = syscall(SYS_clock_gettime, id, ts);
	if (r != 0 || !(id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) return (int)r;
	int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset();
	ts->tv_sec = ns / 1000000000;
	ts->tv_nsec = ns % 1000000000;
	return 0;
}

int gettimeofday(struct timeval *__restrict tv, void *__restrict tz) {
	struct timespec ts;
	(void)tz;
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
	if (tv) {
		tv->tv_sec = ts.tv_sec;
		tv->tv_usec = ts.tv_nsec / 1000;
	}
	return 0;
}

time_t time(time_t *t) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	if (t) *t = ts.tv_sec;
	return ts.tv_sec;
}
`

// NewRedisClock makes a clock at offset 0, for WithClock.
func NewRedisClock(t testing.TB) *RedisClock {
	t.Helper()
	c := &RedisClock{path: filepath.Join(t.TempDir(), "clock-offset")}
	c.Set(0)
	return c
}

// Set puts the clock offset from the machine's (negative: behind). A
// server reading it sees the step at its next clock read.
func (c *RedisClock) Set(offset time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(offset))
	// Written in place, never replaced: the server maps this file.
	f, err := os.OpenFile(c.path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err == nil {
		_, err = f.WriteAt(b[:], 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		panic("harness: set the Redis clock: " + err.Error())
	}
	c.offset = offset
}

// Offset is the clock's offset now.
func (c *RedisClock) Offset() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.offset
}

// WithClock runs the server on clock c.
func WithClock(t testing.TB, c *RedisClock) RedisOption {
	t.Helper()
	lib := clockLib(t)
	return func(rc *redisConfig) {
		rc.env = append(rc.env, "LD_PRELOAD="+lib, "RATION_CLOCK_FILE="+c.path)
	}
}

// clockLib compiles clockShim into the test's temporary directory (a few
// hundred milliseconds of cc), so that nothing outlives the test.
func clockLib(t testing.TB) string {
	t.Helper()
	cc := RequireBinary(t, "cc", "gcc")
	dir := t.TempDir()
	src, lib := filepath.Join(dir, "clock.c"), filepath.Join(dir, "clock.so")
	if err := os.WriteFile(src, []byte(clockShim), 0o600); err != nil {
		t.Fatalf("harness: clock shim: %v", err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("harness: compile the clock shim with %s (Debian: gcc, libc6-dev): %v\n%s", cc, err, out)
	}
	return lib
}
