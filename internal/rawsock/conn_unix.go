//go:build unix

// Package rawsock holds an accepted TCP connection as its raw descriptor
// and joins it to the runtime's poller only when an operation has to
// wait.
//
// Go's net package pays for every accepted connection up front, whether
// it ever waits or not: getsockname(2) for its local address,
// setsockopt(TCP_NODELAY), epoll_ctl(ADD) when it is made and
// epoll_ctl(DEL) when it closes, and about seven allocations where a
// Conn makes one. An HTTP connection accepted with TCP_DEFER_ACCEPT has
// its request in already; when its client asked to close after the
// response, it reads, writes and closes without ever waiting, and all
// four calls are waste: they were four of the ten system calls of a
// connection-per-request exchange. A Conn makes none of them until it
// must: an operation first runs on the descriptor as it is, and only
// when the kernel answers EAGAIN does the Conn register in the poller
// (os.NewFile: one fcntl and the epoll_ctl ADD), from then on waiting,
// with deadlines, as a net.Conn does. TCP_NODELAY comes from the
// listening socket, which Linux copies into every socket it accepts
// (Listener). The local address is the listener's when it is a specific
// one, else looked up on first use.
package rawsock

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hotproxy/hotproxy/internal/nbio"
)

// Conn is an accepted TCP connection (net.Conn, syscall.Conn). Read,
// Write, the deadlines, Close and the RawConn's methods are safe from
// any goroutine, as a net.Conn's are. Until it registers, a deadline
// bounds only waiting: an operation that completes without waiting
// completes even past it, as no wait has started.
type Conn struct {
	fd int
	// refs guards the descriptor while the Conn is unregistered, when
	// nothing else does: the holders of raw operations, in units of
	// refUnit, and the closed and released flags. Close marks it closed;
	// whoever leaves it closed with no holder releases the descriptor,
	// so that a read running in one goroutine never meets a descriptor
	// number that Close in another has handed back to the kernel, and
	// the kernel to the next accept.
	refs atomic.Int64
	// file is the descriptor in the runtime's poller, set once by
	// register (nil until then), and fileRaw its RawConn, set before it.
	// The os.File owns the descriptor from then on, and guards it as
	// net's sockets are guarded.
	file    atomic.Pointer[os.File]
	fileRaw syscall.RawConn
	// mu guards registration, closed, and the deadlines set before it.
	mu                          sync.Mutex
	closed                      bool
	readDeadline, writeDeadline time.Time
	// tunnel is the dup that NetConn made (nil: none), closed with the
	// Conn.
	tunnel net.Conn

	// reading and writing: the state of Read's and Write's calls.
	reading, writing ioCall

	remote     netip.AddrPort
	remoteAddr atomic.Pointer[net.TCPAddr] // made from remote on first use
	localAddr  atomic.Pointer[net.TCPAddr] // the listener's, or getsockname's on first use
}

const (
	refClosed   = 1 // Close was called
	refReleased = 2 // the descriptor was closed (or handed to the os.File's close)
	refUnit     = 4
)

var (
	_ net.Conn     = (*Conn)(nil)
	_ syscall.Conn = (*Conn)(nil)
)

// newConn is the connection on descriptor fd, a non-blocking accepted
// socket, from remote; local is the listener's address when it is a
// specific one (nil: looked up on first use).
func newConn(fd int, remote netip.AddrPort, local *net.TCPAddr) *Conn {
	c := &Conn{fd: fd, remote: remote}
	if local != nil {
		c.localAddr.Store(local)
	}
	return c
}

// acquire holds the unregistered descriptor for one raw operation:
// false when the Conn is closed.
func (c *Conn) acquire() bool {
	if c.refs.Add(refUnit)&refClosed != 0 {
		c.release()
		return false
	}
	return true
}

// release ends what acquire began, closing the descriptor if the Conn
// was closed meanwhile and this was its last holder.
func (c *Conn) release() {
	if c.refs.Add(-refUnit) == refClosed {
		c.releaseDescriptor()
	}
}

// releaseDescriptor closes the descriptor, once: through the os.File
// when the Conn registered (its close also takes it out of the poller),
// else directly.
func (c *Conn) releaseDescriptor() {
	if !c.refs.CompareAndSwap(refClosed, refClosed|refReleased) {
		return
	}
	if f := c.file.Load(); f != nil {
		f.Close()
		return
	}
	unix.Close(c.fd)
}

// Close closes the connection: an operation waiting in another
// goroutine returns net.ErrClosed, and the descriptor is closed at once
// or, if a raw operation holds it, when that returns (without waiting:
// the descriptor is non-blocking). A second Close returns net.ErrClosed.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		// As net's, without the addresses: a TLS connection's close
		// closes its socket, and the front end's close follows.
		return errClosedAgain
	}
	c.closed = true
	tunnel := c.tunnel
	c.mu.Unlock()
	if tunnel != nil {
		tunnel.Close()
	}
	if c.refs.Or(refClosed) < refUnit {
		c.releaseDescriptor() // the os.File's close wakes what waits
		return nil
	}
	// A raw holder closes the descriptor when it lets go; wake what
	// waits in the poller now (if the holder has closed the file by
	// then, this fails, and nothing waits).
	if f := c.file.Load(); f != nil {
		f.SetDeadline(time.Unix(1, 0))
	}
	return nil
}

// errClosedAgain is what a second Close returns.
var errClosedAgain error = &net.OpError{Op: "close", Net: "tcp", Err: net.ErrClosed}

// isClosed reports whether Close was called.
func (c *Conn) isClosed() bool { return c.refs.Load()&refClosed != 0 }

// Register joins the connection to the runtime's poller now, for a
// caller whose next operation is a wait (an idle keep-alive connection
// waiting for its next request): its RawConn callback is then called
// only after a readiness check, never as a retry of a call made before
// the registration.
func (c *Conn) Register() error {
	if c.file.Load() != nil {
		return nil
	}
	return c.register()
}

// register makes the os.File that puts the descriptor in the poller,
// and moves the deadlines set so far onto it.
func (c *Conn) register() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.file.Load() != nil {
		return nil
	}
	if c.closed {
		return net.ErrClosed
	}
	// os.NewFile takes the descriptor as it is (no dup): it sees
	// O_NONBLOCK (one fcntl) and adds it to the poller. The os.File owns
	// the descriptor from here on, whatever follows.
	f := os.NewFile(uintptr(c.fd), "tcp")
	raw, err := f.SyscallConn()
	if err != nil {
		return c.opError("register", err)
	}
	c.fileRaw = raw
	c.file.Store(f)
	// A descriptor the poller refused (epoll_ctl ADD failed: out of
	// memory, or the watch limit) cannot wait, and its os.File's
	// deadline methods say so.
	if err := f.SetDeadline(time.Time{}); err != nil {
		return c.opError("register", errors.New("the runtime's poller refused the socket"))
	}
	if !c.readDeadline.IsZero() {
		f.SetReadDeadline(c.readDeadline)
	}
	if !c.writeDeadline.IsZero() {
		f.SetWriteDeadline(c.writeDeadline)
	}
	return nil
}

// Read reads into p, as net.Conn's Read: io.EOF at the end. It is one
// recvfrom(2) (internal/nbio) when bytes are there, registered or not:
// a registered Conn's wait goes through the poller, but not its calls,
// which an os.File's Read would make as read(2) inside the runtime's
// entersyscall and exitsyscall.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, err := c.call(&c.reading, "read", p)
	if err == nil && n == 0 {
		return 0, io.EOF
	}
	return n, err
}

// Write writes p, as net.Conn's Write: all of it, or an error; as Read,
// with sendto(2).
func (c *Conn) Write(p []byte) (int, error) {
	return c.call(&c.writing, "write", p)
}

// ioCall is the state of Read's or Write's call (readStep, writeStep),
// which goes through rawOp as the RawConn's do: made once, so that a
// call allocates nothing. mu holds one Read, or one Write, at a time to
// it.
type ioCall struct {
	mu  sync.Mutex
	fn  func(fd uintptr) bool // the step, made on the first call
	buf []byte
	n   int   // bytes read, or written so far
	err error // the call's error, other than EAGAIN
}

// call makes Read's (op "read", with c.reading) or Write's call on p.
func (c *Conn) call(s *ioCall, op string, p []byte) (int, error) {
	write := s == &c.writing
	s.mu.Lock()
	if s.fn == nil {
		if write {
			s.fn = c.writeStep
		} else {
			s.fn = c.readStep
		}
	}
	s.buf = p
	err := c.rawOp(op, s.fn, write)
	n, callErr := s.n, s.err
	s.buf, s.n, s.err = nil, 0, nil
	s.mu.Unlock()
	if err == nil && callErr != nil {
		err = c.opError(op, os.NewSyscallError(op, callErr))
	}
	return n, err
}

// readStep is Read's call: done unless the socket has nothing yet.
func (c *Conn) readStep(fd uintptr) bool {
	s := &c.reading
	n, err := nbio.Read(fd, s.buf)
	if err == syscall.EAGAIN {
		return false
	}
	s.n, s.err = n, err
	return true
}

// writeStep is Write's call: done when all of the buffer is written or
// the write failed, not when the send buffer is full.
func (c *Conn) writeStep(fd uintptr) bool {
	s := &c.writing
	for s.n < len(s.buf) {
		n, err := nbio.Write(fd, s.buf[s.n:])
		s.n += n
		if err == syscall.EAGAIN {
			return false
		}
		if err != nil {
			s.err = err
			return true
		}
	}
	return true
}

// SetDeadline sets both deadlines, as net.Conn's.
func (c *Conn) SetDeadline(t time.Time) error {
	return c.setDeadline(t, true, true)
}

// SetReadDeadline sets the read deadline, as net.Conn's.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.setDeadline(t, true, false) }

// SetWriteDeadline sets the write deadline, as net.Conn's.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.setDeadline(t, false, true) }

func (c *Conn) setDeadline(t time.Time, read, write bool) error {
	if f := c.file.Load(); f == nil {
		c.mu.Lock()
		if c.file.Load() == nil {
			defer c.mu.Unlock()
			if c.closed {
				return c.opError("set deadline", net.ErrClosed)
			}
			if read {
				c.readDeadline = t
			}
			if write {
				c.writeDeadline = t
			}
			return nil
		}
		c.mu.Unlock()
	}
	f := c.file.Load()
	var err error
	switch {
	case read && write:
		err = f.SetDeadline(t)
	case read:
		err = f.SetReadDeadline(t)
	default:
		err = f.SetWriteDeadline(t)
	}
	if err != nil {
		return c.opErrorOf("set deadline", err)
	}
	return nil
}

// withFD runs fn on the descriptor, held against a concurrent Close:
// net.ErrClosed once closed.
func (c *Conn) withFD(fn func(fd int) error) error {
	if c.file.Load() != nil {
		var err error
		if cerr := c.fileRaw.Control(func(fd uintptr) { err = fn(int(fd)) }); cerr != nil {
			return c.closedOr(cerr)
		}
		return err
	}
	if !c.acquire() {
		return net.ErrClosed
	}
	defer c.release()
	return fn(c.fd)
}

// CloseWrite shuts down the sending side (a FIN), as TCPConn's.
func (c *Conn) CloseWrite() error {
	err := c.withFD(func(fd int) error { return unix.Shutdown(fd, unix.SHUT_WR) })
	if err != nil {
		return c.opErrorOf("close", os.NewSyscallError("shutdown", err))
	}
	return nil
}

// SetLinger sets SO_LINGER, as TCPConn's: 0 makes Close reset the
// connection.
func (c *Conn) SetLinger(sec int) error {
	l := unix.Linger{Onoff: 1, Linger: int32(sec)}
	if sec < 0 {
		l = unix.Linger{}
	}
	err := c.withFD(func(fd int) error { return unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &l) })
	if err != nil {
		return c.opErrorOf("set", os.NewSyscallError("setsockopt", err))
	}
	return nil
}

// setNoDelay sets TCP_NODELAY, for a socket that did not inherit it.
func (c *Conn) setNoDelay() error {
	return c.withFD(func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1) })
}

// RemoteAddrPort is the client's address and port, without an
// allocation.
func (c *Conn) RemoteAddrPort() netip.AddrPort { return c.remote }

// RemoteAddr is the client's address (a *net.TCPAddr).
func (c *Conn) RemoteAddr() net.Addr {
	if a := c.remoteAddr.Load(); a != nil {
		return a
	}
	a := net.TCPAddrFromAddrPort(c.remote)
	c.remoteAddr.Store(a)
	return a
}

// LocalAddr is the address the client connected to (a *net.TCPAddr):
// the listener's when it is a specific one, else getsockname's, looked
// up once. Nil if the lookup fails (the connection is closed).
func (c *Conn) LocalAddr() net.Addr {
	if a := c.localAddr.Load(); a != nil {
		return a
	}
	var sa unix.Sockaddr
	err := c.withFD(func(fd int) (err error) {
		sa, err = unix.Getsockname(fd)
		return err
	})
	if err != nil {
		return nil
	}
	a := tcpAddrOf(sa)
	if a == nil {
		return nil
	}
	c.localAddr.Store(a)
	return a
}

// tcpAddrOf is sa as a *net.TCPAddr (nil for another family).
func tcpAddrOf(sa unix.Sockaddr) *net.TCPAddr {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port)))
	case *unix.SockaddrInet6:
		return net.TCPAddrFromAddrPort(netip.AddrPortFrom(withZone(netip.AddrFrom16(sa.Addr), sa.ZoneId), uint16(sa.Port)))
	}
	return nil
}

// withZone is ip with the zone of interface index scope (a link-local
// address's), or ip as it is for scope 0 or an interface gone since.
func withZone(ip netip.Addr, scope uint32) netip.Addr {
	if scope == 0 {
		return ip
	}
	if ifi, err := net.InterfaceByIndex(int(scope)); err == nil {
		return ip.WithZone(ifi.Name)
	}
	return ip
}

// NetConn returns the connection as a *net.TCPConn on a duplicate of
// its descriptor, for a tunnel, whose copies between two such sockets
// are splice(2) (io.Copy through TCPConn's ReadFrom). It costs the
// system calls the Conn saved, once, for a connection that lives long.
// Close closes it with the Conn. Use only it from then on: the two
// share one socket, but not their deadlines.
func (c *Conn) NetConn() (*net.TCPConn, error) {
	var dup int
	err := c.withFD(func(fd int) (err error) {
		dup, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, c.opErrorOf("dup", os.NewSyscallError("fcntl", err))
	}
	f := os.NewFile(uintptr(dup), "tcp")
	nc, err := net.FileConn(f) // its own dup, in the poller as net's
	f.Close()
	if err != nil {
		return nil, c.opErrorOf("dup", err)
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		return nil, c.opError("dup", errors.New("not a TCP socket"))
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		tc.Close()
		return nil, c.opError("dup", net.ErrClosed)
	}
	if c.tunnel != nil {
		c.tunnel.Close()
	}
	c.tunnel = tc
	c.mu.Unlock()
	return tc, nil
}

// SyscallConn returns the connection's RawConn: its callbacks run on
// the descriptor as it is, and a callback that asks to wait registers
// the Conn first (see rawConn.Read).
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return (*rawConn)(c), nil }

// rawConn is a Conn's syscall.RawConn.
type rawConn Conn

var _ syscall.RawConn = (*rawConn)(nil)

// Control runs f on the descriptor, held against a concurrent Close.
func (rc *rawConn) Control(f func(fd uintptr)) error {
	c := (*Conn)(rc)
	err := c.withFD(func(fd int) error { f(uintptr(fd)); return nil })
	if err != nil {
		return c.opErrorOf("raw-control", err)
	}
	return nil
}

// Read calls f until it returns true, as net's RawConn.Read does, on
// the descriptor as it is for the first call: when that returns false
// (it would have to wait), the Conn registers, and f is called again
// at once, then after each readiness the poller reports, within the
// read deadline. So f must be a retry-safe step (a read, a write): one
// that counts its calls to tell a wake from the first look must
// Register before.
func (rc *rawConn) Read(f func(fd uintptr) bool) error {
	return (*Conn)(rc).rawOp("raw-read", f, false)
}

// Write is Read for writing, within the write deadline.
func (rc *rawConn) Write(f func(fd uintptr) bool) error {
	return (*Conn)(rc).rawOp("raw-write", f, true)
}

// rawOp is the RawConn's Read (write false) or Write, its errors
// named op.
func (c *Conn) rawOp(op string, f func(fd uintptr) bool, write bool) error {
	if c.file.Load() == nil {
		if !c.acquire() {
			return c.opError(op, net.ErrClosed)
		}
		done := f(uintptr(c.fd))
		c.release()
		if done {
			return nil
		}
		if err := c.register(); err != nil {
			return c.opErrorOf(op, err)
		}
	}
	var err error
	if write {
		err = c.fileRaw.Write(f)
	} else {
		err = c.fileRaw.Read(f)
	}
	if err != nil {
		return c.opErrorOf(op, err)
	}
	return nil
}

// opError wraps err as net's sockets do: "read tcp L->R: ...".
func (c *Conn) opError(op string, err error) error {
	oe := &net.OpError{Op: op, Net: "tcp", Addr: c.RemoteAddr(), Err: err}
	if la := c.LocalAddr(); la != nil {
		oe.Source = la
	}
	return oe
}

// opErrorOf is opError for an error from the os.File or a callback:
// an os.File's closed error becomes net.ErrClosed, and a PathError
// (an os.File's own wrapping) gives up what it wraps, so that callers
// see what a net.Conn would have said.
func (c *Conn) opErrorOf(op string, err error) error {
	if _, ok := err.(*net.OpError); ok {
		return err
	}
	err = c.closedOr(err)
	var pe *os.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return c.opError(op, err)
}

// closedOr is net.ErrClosed for the error of an operation on a closed
// Conn (os.File's are "file already closed" or "use of closed file", or
// the timeout of the past deadline by which Close wakes a wait), else
// err.
func (c *Conn) closedOr(err error) error {
	if c.isClosed() {
		return net.ErrClosed
	}
	return err
}
