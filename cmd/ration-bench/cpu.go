package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of utime and stime in /proc/PID/stat: USER_HZ,
// which is 100 on every Linux architecture Go supports (the kernel
// converts to it for user space whatever its own HZ).
const clockTick = 10 * time.Millisecond

// procCPU is a process's name and the CPU time it has used (user+system).
type procCPU struct {
	name string
	cpu  time.Duration
}

// readProcCPU reads /proc/PID/stat.
func readProcCPU(pid int) (procCPU, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procCPU{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	p, err := parseProcStat(data)
	if err != nil {
		return procCPU{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return p, nil
}

// parseProcStat reads the name (field 2, in parentheses: it may itself hold
// spaces and parentheses, so the last ')' ends it), utime (field 14) and
// stime (field 15) of a /proc/PID/stat line.
func parseProcStat(data []byte) (procCPU, error) {
	open, end := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if open < 0 || end < open {
		return procCPU{}, fmt.Errorf("/proc stat: no (name) in %.60q", data)
	}
	fields := strings.Fields(string(data[end+1:]))
	// fields[0] is field 3 (state), so field n is fields[n-3].
	if len(fields) < 13 {
		return procCPU{}, fmt.Errorf("/proc stat: %d fields after the name, want at least 13", len(fields))
	}
	utime, err1 := strconv.ParseUint(fields[14-3], 10, 64)
	stime, err2 := strconv.ParseUint(fields[15-3], 10, 64)
	if err1 != nil || err2 != nil {
		return procCPU{}, fmt.Errorf("/proc stat: utime %q, stime %q: not numbers", fields[14-3], fields[15-3])
	}
	return procCPU{name: string(data[open+1 : end]), cpu: time.Duration(utime+stime) * clockTick}, nil
}

// cpuUsage is one process's CPU during the measured window.
type cpuUsage struct {
	PID           int     `json:"pid"`
	Name          string  `json:"name"`
	Seconds       float64 `json:"cpu_s"`
	USPerDecision float64 `json:"us_per_decision"`
	Error         string  `json:"error,omitempty"`
}

// cpuWatch samples the CPU time of -pids and of this process at the start
// and end of the measured window.
type cpuWatch struct {
	pids   []int
	before []procCPU
	errs   []error
	self   procCPU
	selfOK bool
}

// newCPUWatch checks that every pid can be read now, so a wrong -pids fails
// before the run rather than after it.
func newCPUWatch(pids []int) (*cpuWatch, error) {
	w := &cpuWatch{pids: pids, before: make([]procCPU, len(pids)), errs: make([]error, len(pids))}
	for _, pid := range pids {
		if _, err := readProcCPU(pid); err != nil {
			return nil, fmt.Errorf("-pids: %w", err)
		}
	}
	return w, nil
}

func (w *cpuWatch) start() {
	for i, pid := range w.pids {
		w.before[i], w.errs[i] = readProcCPU(pid)
	}
	var err error
	w.self, err = readProcCPU(os.Getpid())
	w.selfOK = err == nil
}

// finish reads the second sample and reports each process, and this tool
// itself (nil where /proc is not there).
func (w *cpuWatch) finish(decisions int64) (procs []cpuUsage, self *cpuUsage) {
	usage := func(pid int, name string, d time.Duration) cpuUsage {
		u := cpuUsage{PID: pid, Name: name, Seconds: d.Seconds()}
		if decisions > 0 {
			u.USPerDecision = round1(float64(d.Microseconds()) / float64(decisions))
		}
		return u
	}
	for i, pid := range w.pids {
		after, err := readProcCPU(pid)
		if err == nil {
			err = w.errs[i]
		}
		if err != nil {
			procs = append(procs, cpuUsage{PID: pid, Name: w.before[i].name, Error: err.Error()})
			continue
		}
		procs = append(procs, usage(pid, after.name, after.cpu-w.before[i].cpu))
	}
	if w.selfOK {
		if after, err := readProcCPU(os.Getpid()); err == nil {
			u := usage(os.Getpid(), "ration-bench (this tool)", after.cpu-w.self.cpu)
			self = &u
		}
	}
	return procs, self
}
