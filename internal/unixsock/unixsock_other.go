//go:build !linux

package unixsock

import (
	"fmt"
	"net"
	"time"
)

// Listen needs Linux.
func Listen(network, addr string) (*net.UnixListener, error) {
	return nil, fmt.Errorf("%s: %w", addr, ErrNotSupported)
}

// PeerCred needs Linux.
func PeerCred(*net.UnixConn) (uid, pid int, err error) { return 0, 0, ErrNotSupported }

// Authorize needs Linux.
func Authorize(*net.UnixConn) (int, error) { return 0, ErrNotSupported }

// Holder needs Linux.
func Holder(network, addr string, timeout time.Duration) (uid, pid int, err error) {
	return 0, 0, ErrNotSupported
}

// BoundBy needs Linux.
func BoundBy(string) (uid, pid int, ok bool) { return 0, 0, false }
