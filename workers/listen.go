package workers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/internal/rawsock"
)

// BindError is a listening socket that could not be bound: it names the
// listener and the address and says what to do.
type BindError struct {
	Listener string
	Address  string
	Err      error
}

func (e *BindError) Error() string {
	msg := e.Err.Error()
	var se *os.SyscallError
	if errors.As(e.Err, &se) {
		msg = se.Syscall + ": " + se.Err.Error()
	}
	if hint := BindHint(e.Err); hint != "" {
		msg += " (" + hint + ")"
	}
	return fmt.Sprintf("listener %q: address %q: %s", e.Listener, e.Address, msg)
}

func (e *BindError) Unwrap() error { return e.Err }

// BindHint says what to do about a failed bind, or "" (the admin listener
// uses it too).
func BindHint(err error) string {
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return "another process is listening there; stop it or choose another address"
	case errors.Is(err, syscall.EACCES):
		return "run as root or grant CAP_NET_BIND_SERVICE"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return "no interface of this host has that address"
	case errors.Is(err, errors.ErrUnsupported):
		return "set server.reuse_port = false"
	}
	return ""
}

// socket is one listening socket of a listener.
type socket struct {
	key SocketKey
	ln  *net.TCPListener
	// raw is an HTTP listener's socket as its accept loops take
	// connections from it (rawsock: no per-connection work of net's);
	// nil for a TCP listener, whose sessions splice as net.TCPConns.
	raw   *rawsock.Listener
	owner int // the worker that accepts on it; -1: every worker
	// acceptors counts the accept loops on this socket still running
	// (for the last one to close it when a drain empties it).
	acceptors atomic.Int32
	// handedOver: the drain's successor accepts on this socket
	// (DrainOptions.HandedOver), so a drain does not keep it open for the
	// handshakes under way (awaitHandshakes), as it does one that closes
	// for good.
	handedOver atomic.Bool
	// refusing: the drain's steering program refuses new connections to
	// this socket's group (RefuseNew), so the handshakes under way only
	// end, and awaitHandshakes may wait for all of them.
	refusing atomic.Bool

	closeOnce sync.Once
	closeErr  error
}

// queueOnlyShrinks reports whether nothing new can enter s's queue: the
// steering program refuses new connections to its group and no successor
// accepts on it (the socket closes for good). Then a drain empties the
// queue to the end before the close (acceptor.takeQueued).
func (s *socket) queueOnlyShrinks() bool {
	return s.refusing.Load() && !s.handedOver.Load()
}

// close closes the socket once; later calls return the first result.
func (s *socket) close() error {
	s.closeOnce.Do(func() {
		// Both descriptors: the socket closes once the last does.
		if s.raw != nil {
			s.raw.Close()
		}
		s.closeErr = s.ln.Close()
	})
	return s.closeErr
}

// setAcceptDeadline bounds the accept loops' waits on s (a deadline in
// the past wakes them), on the descriptor they wait on.
func (s *socket) setAcceptDeadline(t time.Time) {
	if s.raw != nil {
		s.raw.SetDeadline(t)
		return
	}
	s.ln.SetDeadline(t)
}

// noKeepAlive: Go would otherwise make three setsockopt calls per accepted
// connection to turn TCP keep-alive on, which a proxy with its own idle
// timeouts does not need. A socket adopted from the previous generation
// (net.FileListener) cannot say so, and a TCP listener's accepts on it
// still pay for them; an HTTP listener's accept raw (prepareHTTP), and
// set nothing.
const noKeepAlive = -1

// openSockets binds or adopts every socket of listener ml. It takes the
// inherited sockets it uses out of inh. On error the sockets it opened are
// in ml.sockets for the caller to close.
func openSockets(ml *mlistener, workers int, reuse bool, inh map[SocketKey]*os.File) error {
	// Adopt every inherited socket of this address, whatever its worker:
	// in a SO_REUSEPORT group, a socket nobody accepts on still gets its
	// share of new connections, and they would be lost.
	var keys []SocketKey
	for k := range inh {
		if k.Network == "tcp" && k.Address == ml.addr {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b SocketKey) int { return a.Worker - b.Worker })
	shared := false
	have := make(map[int]bool, len(keys))
	for _, k := range keys {
		if ml.steer != nil && k.Worker >= workers {
			// The program steers among one socket per worker and
			// never picks this one: it stays in inh, for the
			// caller to hand back (Unused). Whoever closes it last,
			// its queue moves to a live socket of the group.
			continue
		}
		f := inh[k]
		delete(inh, k)
		ln, err := adopt(f)
		f.Close() // the Manager owns it: FileListener made its own dup.
		if err != nil {
			return fmt.Errorf("listener %q: inherited socket %q (worker %d): %w", ml.name, k.Address, k.Worker, err)
		}
		owner := k.Worker
		if owner < 0 {
			shared, owner = true, -1
		} else {
			have[owner] = true
		}
		ml.sockets = append(ml.sockets, &socket{key: k, ln: ln, owner: owner})
	}

	if !reuse || shared {
		// One socket accepted by all workers. An inherited shared
		// socket (no SO_REUSEPORT) cannot take per-worker siblings, so
		// it is used as it is even when reuse_port is on.
		if len(ml.sockets) > 0 {
			return nil
		}
		ln, err := listenTCP(net.ListenConfig{KeepAlive: noKeepAlive}, ml.addr)
		if err != nil {
			return &BindError{Listener: ml.name, Address: ml.addr, Err: err}
		}
		ml.sockets = append(ml.sockets, &socket{key: SocketKey{"tcp", ml.addr, -1}, ln: ln, owner: -1})
		return nil
	}

	host, port, err := net.SplitHostPort(ml.addr)
	if err != nil {
		return &BindError{Listener: ml.name, Address: ml.addr, Err: err}
	}
	addr := ml.addr
	switch {
	case len(ml.sockets) > 0:
		// Join the inherited group, on the port it really has.
		addr = net.JoinHostPort(host, portOf(ml.sockets[0].ln))
	case port != "0":
		// A fresh group. With SO_REUSEPORT, a socket of another process
		// of the same uid that also set it would let us bind silently
		// and take half its connections. A plain bind first fails on
		// any listening socket there, reuseport or not; it is done
		// before our own group exists, which it would also collide with.
		probe, err := listenTCP(net.ListenConfig{}, addr)
		if err != nil {
			return &BindError{Listener: ml.name, Address: ml.addr, Err: err}
		}
		probe.Close()
	}
	lc := net.ListenConfig{Control: reusePortControl, KeepAlive: noKeepAlive}
	if ml.steer != nil {
		// Go listens with MPTCP by default where the kernel has it,
		// and a reuseport socket array takes plain TCP sockets only.
		lc.SetMultipathTCP(false)
	}
	for w := range workers {
		if have[w] {
			continue
		}
		ln, err := listenTCP(lc, addr)
		if err != nil {
			return &BindError{Listener: ml.name, Address: ml.addr, Err: err}
		}
		if port == "0" && len(ml.sockets) == 0 {
			// Port 0: the first socket got a port from the kernel;
			// the rest of the group joins it there.
			addr = net.JoinHostPort(host, portOf(ln))
		}
		ml.sockets = append(ml.sockets, &socket{key: SocketKey{"tcp", ml.addr, w}, ln: ln, owner: w})
	}
	return nil
}

func listenTCP(lc net.ListenConfig, addr string) (*net.TCPListener, error) {
	l, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	return l.(*net.TCPListener), nil
}

func portOf(ln *net.TCPListener) string {
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	return p
}

// adopt turns an inherited file into a TCP listener (a dup of its fd).
func adopt(f *os.File) (*net.TCPListener, error) {
	if f == nil {
		return nil, errors.New("nil file")
	}
	l, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	tl, ok := l.(*net.TCPListener)
	if !ok {
		l.Close()
		return nil, fmt.Errorf("not a TCP listening socket (%T)", l)
	}
	return tl, nil
}

// deferAcceptSeconds is the TCP_DEFER_ACCEPT of an HTTP listener's sockets:
// how long the kernel holds a connection whose client has sent nothing
// before it hands it to accept anyway (then header_timeout runs as for any
// connection).
const deferAcceptSeconds = 1

// prepareHTTP readies every socket of an HTTP listener (plaintext or
// TLS: the client speaks first), inherited ones included:
//   - TCP_DEFER_ACCEPT, so that accept returns a connection with its
//     first bytes in: its first read finds them, where it used to return
//     EAGAIN and wait in the poller for them (docs/benchmarks.md);
//   - the delayed first ACK (setDelayedFirstACK): the first request's
//     ACK rides on its response;
//   - the raw accept (rawsock.Listen): TCP_NODELAY on the listening
//     socket, which the kernel passes on to every socket it accepts, and
//     the duplicate the accept loops wait on. Its connections skip what
//     net does for each (getsockname, TCP_NODELAY, the keep-alive options
//     of an inherited socket, the poller's add and remove and about six
//     allocations) until one has to wait.
//
// None for a TCP listener, whose server may speak first.
func prepareHTTP(ml *mlistener) error {
	if ml.protocol != config.ProtocolHTTP {
		return nil
	}
	for _, s := range ml.sockets {
		err := setDeferAccept(s.ln, deferAcceptSeconds)
		if err == nil {
			err = setDelayedFirstACK(s.ln)
		}
		if err == nil && s.raw == nil {
			s.raw, err = rawsock.Listen(s.ln)
		}
		if err != nil {
			return fmt.Errorf("listener %q: address %q: %w", ml.name, ml.addr, err)
		}
	}
	return nil
}
