//go:build unix

package httpfront

import (
	"syscall"

	"github.com/hotproxy/hotproxy/internal/nbio"
)

// RawIO: the client socket's reads and writes can be made inside
// RawConn callbacks (h1conn.go: rawStep), which lets a deadline be armed
// only when a call would block.
const RawIO = true

// writeFD writes b to the non-blocking socket fd: n bytes written, or
// the error (syscall.EAGAIN: the socket's buffer is full).
func writeFD(fd uintptr, b []byte) (int, error) {
	return nbio.Write(fd, b)
}

// readFD reads into b from the non-blocking socket fd, as writeFD.
func readFD(fd uintptr, b []byte) (int, error) {
	return nbio.Read(fd, b)
}

func wouldBlock(err error) bool { return err == syscall.EAGAIN }
