// Package unixsock listens on Unix sockets that only this process's user
// (or root) may talk to: the restart socket between generations and the
// supervisor's control socket. Whoever speaks on the first can take the
// listening sockets, and on the second can reload or stop the service, so
// both bind the same way and check each peer the same way.
package unixsock

import (
	"errors"
	"fmt"
)

// ErrInUse means a live listener already answers at the address.
var ErrInUse = errors.New("a live listener already answers at this address")

// ErrNotSupported is returned where Unix peer credentials do not exist.
var ErrNotSupported = errors.New("Unix socket peer credentials are not supported on this platform")

// StrangerError is a peer that runs as another user (and not as root).
type StrangerError struct {
	UID, PID int // the peer's, as the kernel recorded them
	Self     int // this process's uid
}

func (e *StrangerError) Error() string {
	return fmt.Sprintf("peer (pid %d) runs as uid %d; only uid %d or root may use this socket", e.PID, e.UID, e.Self)
}
