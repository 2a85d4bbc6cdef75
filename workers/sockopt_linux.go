//go:build linux

package workers

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// reusePortControl is a net.ListenConfig.Control that sets SO_REUSEADDR and
// SO_REUSEPORT before bind, so that every worker binds its own socket to
// the listener's address and the kernel spreads connections among them.
func reusePortControl(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); serr != nil {
			serr = fmt.Errorf("setsockopt SO_REUSEADDR: %w", serr)
			return
		}
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); serr != nil {
			serr = fmt.Errorf("setsockopt SO_REUSEPORT: %w", serr)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// acceptQueued takes one connection already queued on ln without waiting,
// ignoring ln's deadline (which a stopped accept loop has set in the past).
// It returns nil when the queue is empty. A draining generation empties
// its sockets' queues this way before closing them: closing a listening
// socket resets every connection still queued in it.
func acceptQueued(ln *net.TCPListener) *net.TCPConn {
	raw, err := ln.SyscallConn()
	if err != nil {
		return nil
	}
	nfd := -1
	raw.Control(func(fd uintptr) {
		for {
			nfd, _, err = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			if err != unix.EINTR && err != unix.ECONNABORTED {
				return
			}
		}
	})
	if nfd < 0 {
		return nil
	}
	f := os.NewFile(uintptr(nfd), "accepted")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil
	}
	tc, _ := c.(*net.TCPConn)
	return tc
}

// setDeferAccept sets TCP_DEFER_ACCEPT on the listening socket ln: the
// kernel completes a connection's accept when its first bytes arrive (or
// after secs seconds without any, rounded up to its SYN-ACK retransmission
// schedule), so that the first read of an accepted connection finds the
// request head already there instead of returning EAGAIN and waiting in
// the poller. Only for protocols whose client speaks first.
func setDeferAccept(ln *net.TCPListener, secs int) error {
	return setTCPOption(ln, "TCP_DEFER_ACCEPT", unix.TCP_DEFER_ACCEPT, secs)
}

// setDelayedFirstACK clears TCP_QUICKACK on the listening socket ln, which
// the sockets it accepts inherit (the kernel copies the listener's
// delayed-ACK mode into each child): the ACK of a connection's first
// request then rides on the response instead of going out alone the
// moment the request arrives. One segment less per connection, sent and
// received in the client's own send path (on loopback, on the client's
// CPU); HAProxy does the same on its HTTP listeners. Only for protocols
// whose server answers the client's first bytes: the ACK still goes out
// on its own after the delayed-ACK timeout (40ms and up) if the answer
// takes longer, and at once for a second full segment, so a request body
// is never held up.
func setDelayedFirstACK(ln *net.TCPListener) error {
	err := setTCPOption(ln, "TCP_QUICKACK", unix.TCP_QUICKACK, 0)
	if errors.Is(err, unix.ENOPROTOOPT) {
		// An MPTCP listening socket (Go's default where the kernel has
		// it, for a listener without the steering program) takes few
		// TCP options: its first ACKs go out alone, as without this.
		return nil
	}
	return err
}

// setTCPOption sets the IPPROTO_TCP option opt (named name, for the
// error) of the listening socket ln to v.
func setTCPOption(ln *net.TCPListener, name string, opt, v int) error {
	raw, err := ln.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, opt, v)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("setsockopt %s: %w", name, serr)
	}
	return nil
}
