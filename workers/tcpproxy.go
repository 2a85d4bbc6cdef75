package workers

import (
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotproxy/hotproxy/route"
	"github.com/hotproxy/hotproxy/stats"
	"github.com/hotproxy/hotproxy/upstream"
)

// bufSize is the copy buffer of a TCP session direction and of the HTTP
// proxy's body copies.
const bufSize = 32 << 10

var bufs = sync.Pool{New: func() any { return new([bufSize]byte) }}

// bufferPool is httputil.BufferPool over bufs.
type bufferPool struct{}

func (bufferPool) Get() []byte { return bufs.Get().(*[bufSize]byte)[:] }

func (bufferPool) Put(b []byte) {
	if len(b) == bufSize {
		bufs.Put((*[bufSize]byte)(b))
	}
}

// procStart anchors monotonic timestamps.
var procStart = time.Now()

func monotime() int64 { return int64(time.Since(procStart)) }

// tcpSession is one proxied TCP connection: the client, the upstream, and
// the idle timer that watches both directions.
type tcpSession struct {
	client *net.TCPConn
	slots  *connSlots // the slot accept took; serveTCP's end gives it back
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

// Close closes both sides (drain deadline, idle timeout, an error in one
// direction). Safe to call more than once and concurrently.
func (s *tcpSession) Close() error {
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
func (s *tcpSession) setUpstream(up net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		up.Close()
		return false
	}
	s.up = up
	return true
}

func (s *tcpSession) checkIdle() {
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

// serveTCP proxies one accepted connection to the listener's cluster.
func (m *Manager) serveTCP(wk *worker, li int, st *listenerStats, s *tcpSession) {
	defer m.connWG.Done()
	defer func() {
		s.done.Store(true)
		s.Close()
		wk.conns.remove(s)
		st.closed()
		s.slots.release() // connection slot (connlimit.go): once, here
	}()
	lv := wk.view.Load().listeners[li]
	if lv == nil {
		return
	}
	wc, hashOn := lv.tcp, lv.tcpHashOn
	var hello []byte // passthrough: the bytes read for the ClientHello
	var client net.Conn = s.client
	switch {
	case s.clientTLS != nil:
		lt := m.listeners[li].tls
		if _, err := lt.handshake(s.clientTLS, s.client, st.tls); err != nil {
			if m.log.IsDebug() {
				m.log.Debug("TLS handshake failed", "listener", lv.name, "client", s.client.RemoteAddr(), "error", err)
			}
			return
		}
		client = s.clientTLS
	case len(lv.sniRoutes) > 0:
		wc, hashOn, hello = lv.passthroughCluster(s.client)
		if wc == nil {
			st.sniNoRoute.Inc()
			return
		}
		st.rxBytes.Add(uint64(len(hello)))
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
	up, endpoint, done, err := wc.DialTCPKey(m.ctx, key)
	if err != nil {
		// Nothing to say in L4 but closing.
		if m.log.IsDebug() {
			m.log.Debug("tcp upstream connect failed", "listener", lv.name, "worker", wk.id, "error", err)
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
	if m.log.IsTrace() {
		m.log.Trace("tcp connection", "listener", lv.name, "worker", wk.id, "client", s.client.RemoteAddr(), "upstream", endpoint)
	}
	s.idle = lv.idleTimeout
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
		s.pipe(up, client, st.rxBytes)
	}()
	s.pipe(client, up, st.txBytes)
	<-upDone
}

// pipe copies src to dst until src ends. At EOF it half-closes dst and
// returns, leaving the other direction running; on an error it closes
// the whole session. Between two TCP sockets the copy is splice(2): the
// bytes never enter user space; a TLS side goes through a buffer. It goes in chunks so that the byte count
// and the idle clock advance while a long transfer runs.
func (s *tcpSession) pipe(dst, src net.Conn, n stats.CounterLane) {
	dtc, dok := unwrapTCP(dst)
	stc, sok := unwrapTCP(src)
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

// unwrapTCP finds the *net.TCPConn under a counted upstream connection.
func unwrapTCP(c net.Conn) (*net.TCPConn, bool) {
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
func (s *tcpSession) pipeCopy(dst, src net.Conn, n stats.CounterLane) {
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
			if rerr == io.EOF && closeWrite(dst) == nil {
				return
			}
			s.Close()
			return
		}
	}
}
