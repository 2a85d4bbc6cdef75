//go:build !linux

package harness

import "syscall"

// sysProcAttr has nothing to add where there is no parent-death signal.
func sysProcAttr() *syscall.SysProcAttr { return nil }
