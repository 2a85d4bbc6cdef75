//go:build unix

package upstream

import (
	"io"
	"syscall"
)

// peerClosed peeks at an idle pooled connection without waiting: EOF, an
// error or stray bytes all mean it must not carry a request.
func peerClosed(fd uintptr) bool {
	var b [1]byte
	n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return n > 0 || (err != syscall.EAGAIN && err != syscall.EINTR)
}

// readNoWait is one read(2) of a socket that never waits (Go's sockets
// are non-blocking): errWouldBlock when nothing is there yet.
func readNoWait(fd uintptr, p []byte) (int, error) {
	n, err := syscall.Read(int(fd), p)
	switch {
	case err == syscall.EAGAIN || err == syscall.EINTR:
		return 0, errWouldBlock
	case err != nil:
		return 0, err
	case n == 0 && len(p) > 0:
		return 0, io.EOF
	}
	return n, nil
}
