//go:build unix && !linux

package nbio

import "syscall"

// Elsewhere, read(2) and write(2) (see the package comment).
const (
	recvTrap  = syscall.SYS_READ
	sendTrap  = syscall.SYS_WRITE
	sendFlags = 0
)
