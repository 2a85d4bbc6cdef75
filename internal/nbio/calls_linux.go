package nbio

import "syscall"

// On Linux, the socket calls (see the package comment).
const (
	recvTrap  = syscall.SYS_RECVFROM
	sendTrap  = syscall.SYS_SENDTO
	sendFlags = syscall.MSG_NOSIGNAL
)

// WriteMore is Write with MSG_MORE: the kernel sends the full segments
// of p and keeps its tail until the next send without the flag, or the
// FIN of a close or shutdown, which then carries it.
func WriteMore(fd uintptr, p []byte) (int, error) {
	return send(fd, p, syscall.MSG_MORE|syscall.MSG_NOSIGNAL)
}
