//go:build linux

package httpfront

import "github.com/hotproxy/hotproxy/internal/nbio"

// writeFDMore is writeFD, with MSG_MORE when more: the kernel sends the
// full segments and keeps the tail until the next send without it, or
// the FIN of a close or shutdown, which it then carries.
func writeFDMore(fd uintptr, b []byte, more bool) (int, error) {
	if !more {
		return writeFD(fd, b)
	}
	return nbio.WriteMore(fd, b)
}
