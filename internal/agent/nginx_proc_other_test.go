//go:build !linux

package agent_test

import "syscall"

// nginxProcAttr puts nginx in its own process group, so master and workers
// are stopped together.
func nginxProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
