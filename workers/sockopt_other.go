//go:build !linux

package workers

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// reusePortControl: SO_REUSEPORT load spreading is Linux-only here.
func reusePortControl(_, _ string, _ syscall.RawConn) error {
	return fmt.Errorf("SO_REUSEPORT per-worker sockets (set server.reuse_port = false): %w", errors.ErrUnsupported)
}

// acceptQueued: without a raw non-blocking accept, a stopped socket's queue
// is not emptied before it closes.
func acceptQueued(*net.TCPListener) *net.TCPConn { return nil }

// setDeferAccept: TCP_DEFER_ACCEPT is Linux's; elsewhere a connection is
// accepted at the handshake, as without it.
func setDeferAccept(*net.TCPListener, int) error { return nil }

// setDelayedFirstACK: clearing TCP_QUICKACK on a listener is Linux's;
// elsewhere the first request's ACK goes out alone, as without it.
func setDelayedFirstACK(*net.TCPListener) error { return nil }
