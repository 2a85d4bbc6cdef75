//go:build linux

package httpfront

import "golang.org/x/sys/unix"

// writeFDMore is writeFD, with MSG_MORE when more: the kernel sends the
// full segments and keeps the tail until the next send without it, or
// the FIN of a close or shutdown, which it then carries.
func writeFDMore(fd uintptr, b []byte, more bool) (int, error) {
	if !more {
		return writeFD(fd, b)
	}
	for {
		n, err := unix.SendmsgN(int(fd), b, nil, nil, unix.MSG_MORE|unix.MSG_NOSIGNAL)
		if err == unix.EINTR {
			continue
		}
		return max(n, 0), err
	}
}
