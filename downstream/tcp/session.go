package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hotproxy/hotproxy/route"
	"github.com/hotproxy/hotproxy/stats"
	"github.com/hotproxy/hotproxy/upstream"
)

// bufSize is the copy buffer of a session direction that goes through
// user space (a TLS side).
const bufSize = 32 << 10

var bufs = sync.Pool{New: func() any { return new([bufSize]byte) }}

// procStart anchors the sessions' monotonic timestamps.
var procStart = time.Now()

func monotime() int64 { return int64(time.Since(procStart)) }

// Session is one proxied TCP connection: the client, the upstream, and
// the idle timer that watches both directions. The worker that accepted
// the client registers it in its connection set (Close is what a drain
// calls) and runs Serve on it.
type Session struct {
	client *net.TCPConn
	idle   time.Duration
	last   atomic.Int64 // monotime of the last read, either direction
	done   atomic.Bool
	// clientTLS, when the listener terminates TLS, is the tls.Conn over
	// client that the session reads and writes (the plaintext).
	clientTLS *tls.Conn
	// progress is the client socket's byte count at the idle timer's
	// last look (touched by the timer only).
	progress uint64

	mu     sync.Mutex // guards up, closed, timer
	up     net.Conn
	closed bool
	timer  *time.Timer
}

// NewSession is a session for an accepted client; clientTLS, when the
// listener terminates TLS, is the tls.Conn over client, whose handshake
// the worker runs before Serve.
func NewSession(client *net.TCPConn, clientTLS *tls.Conn) *Session {
	return &Session{client: client, clientTLS: clientTLS}
}

// Client is the accepted socket.
func (s *Session) Client() *net.TCPConn { return s.client }

// ClientTLS is the TLS connection over Client, or nil.
func (s *Session) ClientTLS() *tls.Conn { return s.clientTLS }

// Close closes both sides (drain deadline, idle timeout, an error in one
// direction). Safe to call more than once and concurrently.
func (s *Session) Close() error {
	s.mu.Lock()
	s.closed = true
	up := s.up
	s.mu.Unlock()
	err := s.client.Close()
	if up != nil {
		up.Close()
	}
	return err
}

// setUpstream attaches the upstream connection; false if the session was
// closed meanwhile (the upstream is then closed).
func (s *Session) setUpstream(up net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		up.Close()
		return false
	}
	s.up = up
	return true
}

func (s *Session) checkIdle() {
	if s.done.Load() {
		return
	}
	since := time.Duration(monotime() - s.last.Load())
	if since >= s.idle {
		// splice(2) moves bytes without telling us: ask the kernel
		// whether the connection moved since the last look.
		if p, ok := tcpProgress(s.client); ok && p != s.progress {
			s.progress = p
			s.last.Store(monotime())
			since = 0
		} else {
			s.Close()
			return
		}
	}
	s.mu.Lock()
	s.timer.Reset(s.idle - since)
	s.mu.Unlock()
}

// Listener is what the TCP front end reads of a tcp listener in one
// worker's view of a snapshot (immutable, replaced whole on a publish).
type Listener struct {
	Name string
	// Cluster is the listener's cluster; nil for a passthrough listener
	// without a default one. HashOn is its hash_on (only source_ip
	// applies to TCP).
	Cluster *upstream.WorkerCluster
	HashOn  route.HashSource
	// TLS passthrough: the sni_routes and their clusters (same index),
	// and how long a client may take to send its ClientHello.
	SNIRoutes    route.SNITable
	SNIClusters  []*upstream.WorkerCluster
	HelloTimeout time.Duration
	IdleTimeout  time.Duration
}

// Counters are the worker's lanes of the listener's stats that a session
// adds to.
type Counters struct {
	RxBytes, TxBytes stats.CounterLane
	// SNINoRoute counts passthrough connections closed for want of a
	// cluster (StatSNINoRoute).
	SNINoRoute stats.CounterLane
}

// Env is what the worker running a session lends it.
type Env struct {
	// Ctx ends with the worker set (the Manager's context): it bounds
	// the upstream dial.
	Ctx    context.Context
	Log    hclog.Logger
	Worker int
}

// Serve proxies the session to l's cluster (or, passing TLS through, the
// cluster its ClientHello's SNI names) until both directions end, the idle
// timeout passes or Close is called. A listener that terminates TLS has
// had its handshake done by the caller: Serve reads and writes ClientTLS.
// It closes nothing on return: the caller closes the session.
func (s *Session) Serve(env Env, l *Listener, n Counters) {
	defer s.done.Store(true)
	wc, hashOn := l.Cluster, l.HashOn
	var hello []byte // passthrough: the bytes read for the ClientHello
	var client net.Conn = s.client
	switch {
	case s.clientTLS != nil:
		client = s.clientTLS
	case len(l.SNIRoutes) > 0:
		wc, hashOn, hello = l.passthroughCluster(s.client)
		if wc == nil {
			n.SNINoRoute.Inc()
			return
		}
		n.RxBytes.Add(uint64(len(hello)))
	}
	if wc == nil {
		return
	}
	var key uint64
	if hashOn.Kind == route.HashSourceIP {
		// A TCP connection has no header or cookie: a ring_hash or
		// maglev cluster keyed otherwise picks at random.
		if ta, ok := s.client.RemoteAddr().(*net.TCPAddr); ok {
			var ip [46]byte
			key = upstream.HashKey(ta.AddrPort().Addr().Unmap().AppendTo(ip[:0]))
		}
	}
	up, endpoint, done, err := wc.DialTCPKey(env.Ctx, key)
	if err != nil {
		// Nothing to say in L4 but closing.
		if env.Log.IsDebug() {
			env.Log.Debug("tcp upstream connect failed", "listener", l.Name, "worker", env.Worker, "error", err)
		}
		return
	}
	defer done()
	if !s.setUpstream(up) {
		return
	}
	if len(hello) > 0 {
		if _, err := up.Write(hello); err != nil {
			return
		}
	}
	if env.Log.IsTrace() {
		env.Log.Trace("tcp connection", "listener", l.Name, "worker", env.Worker, "client", s.client.RemoteAddr(), "upstream", endpoint)
	}
	s.idle = l.IdleTimeout
	s.last.Store(monotime())
	s.mu.Lock()
	s.timer = time.AfterFunc(s.idle, s.checkIdle)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.timer.Stop()
		s.mu.Unlock()
	}()

	upDone := make(chan struct{})
	go func() {
		defer close(upDone)
		s.pipe(up, client, n.RxBytes)
	}()
	s.pipe(client, up, n.TxBytes)
	<-upDone
}

// pipe copies src to dst until src ends. At EOF it half-closes dst and
// returns, leaving the other direction running; on an error it closes
// the whole session. Between two TCP sockets the copy is splice(2): the
// bytes never enter user space; a TLS side goes through a buffer. It goes in chunks so that the byte count
// and the idle clock advance while a long transfer runs.
func (s *Session) pipe(dst, src net.Conn, n stats.CounterLane) {
	dtc, dok := UnwrapTCP(dst)
	stc, sok := UnwrapTCP(src)
	if !dok || !sok {
		s.pipeCopy(dst, src, n)
		return
	}
	lr := &io.LimitedReader{R: stc}
	for {
		lr.N = spliceChunk
		nr, err := dtc.ReadFrom(lr)
		if nr > 0 {
			s.last.Store(monotime())
			n.Add(uint64(nr))
		}
		if err != nil {
			s.Close()
			return
		}
		if lr.N > 0 {
			// Short of the chunk without an error: src is at EOF.
			if dtc.CloseWrite() != nil {
				s.Close()
			}
			return
		}
	}
}

// spliceChunk is how much one splice loop moves before the counters and
// the idle clock are updated.
const spliceChunk = 1 << 20

// UnwrapTCP finds the *net.TCPConn under a counted upstream connection
// (what splice(2) needs: the HTTP/1.1 front end's CONNECT tunnel too).
func UnwrapTCP(c net.Conn) (*net.TCPConn, bool) {
	switch c := c.(type) {
	case *net.TCPConn:
		return c, true
	case interface{ TCPConn() *net.TCPConn }:
		return c.TCPConn(), c.TCPConn() != nil
	}
	return nil, false
}

// pipeCopy is pipe through a user-space buffer, for connections that are
// not plain TCP sockets.
func (s *Session) pipeCopy(dst, src net.Conn, n stats.CounterLane) {
	b := bufs.Get().(*[bufSize]byte)
	defer bufs.Put(b)
	for {
		nr, rerr := src.Read(b[:])
		if nr > 0 {
			s.last.Store(monotime())
			n.Add(uint64(nr))
			if _, werr := dst.Write(b[:nr]); werr != nil {
				s.Close()
				return
			}
		}
		if rerr != nil {
			if rerr == io.EOF && CloseWrite(dst) == nil {
				return
			}
			s.Close()
			return
		}
	}
}

// CloseWrite ends the write side of c: for TLS, a close_notify alert and
// then the TCP FIN (tls.Conn.CloseWrite sends only the alert, and a peer
// waiting for EOF on the socket would wait forever).
func CloseWrite(c net.Conn) error {
	if tc, ok := c.(*tls.Conn); ok {
		err := tc.CloseWrite()
		if cw, ok := tc.NetConn().(interface{ CloseWrite() error }); ok {
			err = errors.Join(err, cw.CloseWrite())
		}
		return err
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
