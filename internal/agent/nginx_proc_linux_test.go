package agent_test

import "syscall"

// nginxProcAttr puts nginx in its own process group (so master and workers
// are stopped together) and kills the master if the test binary dies before
// its cleanups run.
func nginxProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
