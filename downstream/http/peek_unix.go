//go:build unix

package httpfront

import "syscall"

// peekFD peeks at one byte without waiting: ready when there is a byte,
// EOF or an error to read.
func peekFD(fd uintptr) bool {
	var b [1]byte
	_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err != syscall.EAGAIN && err != syscall.EINTR
}
