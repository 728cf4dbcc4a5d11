package harness

import "syscall"

// procAttr makes a child server die with the test binary, even when the
// binary is killed (a test timeout) before its cleanups run.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
