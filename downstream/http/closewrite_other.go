//go:build !linux

package httpfront

// writeFDMore is writeFD: without MSG_MORE the response and the FIN go
// apart, as without writeBeforeClose.
func writeFDMore(fd uintptr, b []byte, _ bool) (int, error) { return writeFD(fd, b) }
