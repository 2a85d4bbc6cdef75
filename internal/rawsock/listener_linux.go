//go:build linux

package rawsock

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Listener accepts Conns from a listening TCP socket. It holds a
// duplicate of the socket's descriptor, registered in the runtime's
// poller: net.TCPListener's RawConn has no Read to wait in (it returns
// EINVAL), and only a RawConn.Read waits for readiness with the
// deadlines and the wake on close that an accept loop needs. The two
// descriptors are one socket: closing the socket for good takes closing
// both (Close, and the net.TCPListener's own).
type Listener struct {
	file *os.File
	raw  syscall.RawConn
	// local is the address accepted connections report as theirs when
	// the socket is bound to a specific address; nil for a wildcard one
	// (each connection looks its own up, on first use).
	local *net.TCPAddr
	// noDelayEach: the kernel refused TCP_NODELAY on the listening
	// socket (an MPTCP one on a kernel that predates it there), so each
	// accepted socket sets its own.
	noDelayEach bool
	closed      atomic.Bool // Close was called
}

// Listen prepares ln's socket for Acceptors: TCP_NODELAY on the
// listening socket, which Linux copies into every socket it accepts (so
// no connection sets it: Go sets it on each), and the duplicate to wait
// in. ln stays the caller's, and open: Close closes only the duplicate.
func Listen(ln *net.TCPListener) (*Listener, error) {
	rc, err := ln.SyscallConn()
	if err != nil {
		return nil, err
	}
	dup := -1
	noDelayEach := false
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if e := unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); e != nil {
			if !errors.Is(e, unix.ENOPROTOOPT) && !errors.Is(e, unix.EOPNOTSUPP) {
				serr = os.NewSyscallError("setsockopt TCP_NODELAY", e)
				return
			}
			noDelayEach = true
		}
		dup, serr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
		if serr != nil {
			serr = os.NewSyscallError("fcntl F_DUPFD_CLOEXEC", serr)
		}
	}); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, serr
	}
	f := os.NewFile(uintptr(dup), "tcp-listener")
	if err := f.SetDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("the runtime's poller refused the listening socket: %w", err)
	}
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	l := &Listener{file: f, raw: raw, noDelayEach: noDelayEach}
	if ta, ok := ln.Addr().(*net.TCPAddr); ok && !ta.IP.IsUnspecified() {
		l.local = ta
	}
	return l, nil
}

// SetDeadline bounds the Acceptors' waits, as net.TCPListener's: a
// deadline in the past wakes them.
func (l *Listener) SetDeadline(t time.Time) error { return l.file.SetDeadline(t) }

// Close closes the duplicate: what waits returns net.ErrClosed. The
// socket itself closes when its other descriptors do too.
func (l *Listener) Close() error {
	l.closed.Store(true)
	return l.file.Close()
}

// Acceptor is one goroutine's accept on a Listener: the scratch the
// accept4(2) callback fills, and the callback itself, made once (a
// closure per accept would be an allocation per connection).
type Acceptor struct {
	l     *Listener
	tryFn func(fd uintptr) bool
	nfd   int
	err   error
	rsa   unix.RawSockaddrAny
}

// NewAcceptor returns an Acceptor on l, for one goroutine.
func (l *Listener) NewAcceptor() *Acceptor {
	a := &Acceptor{l: l}
	a.tryFn = a.try
	return a
}

// Accept waits for the next connection, within the Listener's
// deadline. Errors are net's: net.ErrClosed once the Listener is
// closed, a timeout at the deadline, an *os.SyscallError from
// accept4(2) (EMFILE and the like) otherwise.
func (a *Acceptor) Accept() (*Conn, error) {
	if err := a.l.raw.Read(a.tryFn); err != nil {
		return nil, a.opError(a.l.closedOr(err))
	}
	return a.take()
}

// AcceptQueued takes a connection that is queued on the socket already,
// without waiting and whatever the deadline; nil when there is none.
func (a *Acceptor) AcceptQueued() *Conn {
	a.nfd, a.err = -1, nil
	if err := a.l.raw.Control(func(fd uintptr) { a.try(fd) }); err != nil || a.nfd < 0 {
		return nil
	}
	c, err := a.take()
	if err != nil {
		return nil
	}
	return c
}

// try is one accept4(2), made raw: the socket is non-blocking, so it
// never waits, and the runtime's system-call bracket would only hand
// the P over. false: nothing queued (wait).
func (a *Acceptor) try(fd uintptr) bool {
	for {
		addrlen := uint32(unsafe.Sizeof(a.rsa))
		nfd, _, e := syscall.RawSyscall6(unix.SYS_ACCEPT4, fd, uintptr(unsafe.Pointer(&a.rsa)), uintptr(unsafe.Pointer(&addrlen)),
			unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
		switch e {
		case 0:
			a.nfd, a.err = int(nfd), nil
			return true
		case syscall.EINTR, syscall.ECONNABORTED:
			// A connection reset while queued: take the next.
			continue
		case syscall.EAGAIN:
			a.nfd = -1
			return false
		}
		a.nfd, a.err = -1, os.NewSyscallError("accept4", e)
		return true
	}
}

// take makes the Conn of what try accepted.
func (a *Acceptor) take() (*Conn, error) {
	if a.err != nil {
		return nil, a.opError(a.err)
	}
	remote, ok := addrPortOf(&a.rsa)
	if !ok {
		unix.Close(a.nfd)
		return nil, a.opError(fmt.Errorf("accepted a connection of address family %d, not TCP/IP", a.rsa.Addr.Family))
	}
	c := newConn(a.nfd, remote, a.l.local)
	if a.l.noDelayEach {
		if err := c.setNoDelay(); err != nil {
			c.Close()
			return nil, a.opError(os.NewSyscallError("setsockopt TCP_NODELAY", err))
		}
	}
	return c, nil
}

// opError wraps err as net.TCPListener's Accept does.
func (a *Acceptor) opError(err error) error {
	oe := &net.OpError{Op: "accept", Net: "tcp", Err: err}
	if a.l.local != nil {
		oe.Addr = a.l.local
	}
	return oe
}

// closedOr is net.ErrClosed, as a closed net.TCPListener reports it,
// for the error of a wait that Close ended (the os.File says "use of
// closed file"); else err.
func (l *Listener) closedOr(err error) error {
	if l.closed.Load() {
		return net.ErrClosed
	}
	return err
}

// addrPortOf is the TCP/IP address in rsa; false for another family.
func addrPortOf(rsa *unix.RawSockaddrAny) (netip.AddrPort, bool) {
	switch rsa.Addr.Family {
	case unix.AF_INET:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(rsa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), portOf(sa.Port)), true
	case unix.AF_INET6:
		sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(rsa))
		return netip.AddrPortFrom(withZone(netip.AddrFrom16(sa.Addr), sa.Scope_id), portOf(sa.Port)), true
	}
	return netip.AddrPort{}, false
}

// portOf is a sockaddr's port, which the kernel stores in network byte
// order.
func portOf(p uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(&p))
	return uint16(b[0])<<8 | uint16(b[1])
}
