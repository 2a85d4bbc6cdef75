//go:build unix

package upstream

import "syscall"

// peerClosed peeks at an idle pooled connection without waiting: EOF, an
// error or stray bytes all mean it must not carry a request.
func peerClosed(fd uintptr) bool {
	var b [1]byte
	n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return n > 0 || (err != syscall.EAGAIN && err != syscall.EINTR)
}
