package harness

import "syscall"

// sysProcAttr makes a started process die with the test process (SIGKILL
// when its parent goes away), so a crashed test run leaves no proxy behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
