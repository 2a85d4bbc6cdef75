package upstream

import (
	"crypto/tls"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hotproxy/hotproxy/internal/nbio"
)

// Conn is one HTTP/1.1 connection to an endpoint of a cluster, owned by the
// request that took it from its worker's pool until that request gives it
// back with Release. No goroutine watches a pooled connection: a stale one
// (closed by the upstream while idle) is found by the request that uses it
// next, which may retry on a fresh connection (see Reused).
//
// For a cluster with [clusters.tls], Read and Write go through TLS (the
// handshake was done at the dial); the socket itself is not exposed, so
// nothing can write plaintext under the TLS session by mistake.
type Conn struct {
	tcp       *net.TCPConn
	tls       *tls.Conn       // nil: plaintext
	transport *tlsTransport   // under tls
	probe     [1]byte         // tlsClosedByPeer's read buffer
	raw       syscall.RawConn // for the staleness peek, taken once
	peek      func(fd uintptr)
	stale     bool
	wc        *WorkerCluster
	endpoint  int    // index of the endpoint in the cluster
	addr      string // the endpoint's address when it was dialed
	reused    bool   // taken from the pool, not freshly dialed
	idleAt    int64  // monotonic time it went back to the pool
	counted   *Stats
	// The circuit-breaker slots the connection holds: one of
	// max_connections while it is open (cx), one of max_requests (rq)
	// and, for a retry, one of max_retries while a request uses it.
	brk          *breakers
	holdsRequest bool
	holdsRetry   bool

	// tryDeadline is the deadline SetTryDeadline set last on both
	// directions, in Unix nanoseconds; zero once anything else set
	// either. Atomic: a request body's pump sets the write deadline from
	// its own goroutine.
	tryDeadline atomic.Int64

	// SendThenRead's state, for its RawConn.Read callback (a method value
	// made once per connection: a closure per request would allocate).
	sr sendRecv
}

// sendRecv is one SendThenRead in progress.
type sendRecv struct {
	step       func(fd uintptr) bool
	bufs       [2][]byte
	vec        net.Buffers
	vecArr     [2][]byte
	p          []byte
	n          int
	sent       bool
	werr, rerr error
}

// Stream is a connection that can half-close: *net.TCPConn, or
// *tls.Conn (whose CloseWrite sends a close_notify).
type Stream interface {
	net.Conn
	CloseWrite() error
}

var (
	_ Stream = (*net.TCPConn)(nil)
	_ Stream = (*tls.Conn)(nil)
)

// Read reads the response (decrypted, for TLS).
func (c *Conn) Read(p []byte) (int, error) {
	if c.tls != nil {
		return c.tls.Read(p)
	}
	return c.tcp.Read(p)
}

// Write writes to the upstream (encrypted, for TLS).
func (c *Conn) Write(p []byte) (int, error) {
	if c.tls != nil {
		return c.tls.Write(p)
	}
	return c.tcp.Write(p)
}

// WriteBuffers writes v, consuming it as net.Buffers.WriteTo does: one
// writev(2) in plaintext; a TLS record per buffer over TLS.
func (c *Conn) WriteBuffers(v *net.Buffers) (int64, error) {
	if c.tls != nil {
		return v.WriteTo(c.tls)
	}
	return v.WriteTo(c.tcp)
}

// SendThenRead writes head and body (either may be empty) and reads the
// first bytes of the answer into p, without the read that would find
// nothing: a Write then a Read costs a read(2) that returns EAGAIN on
// almost every request (the upstream cannot have answered a request it
// got microseconds ago), then a wait, then the read. Here the wait comes
// first: Go's poller forgets a readiness it saw before a wait begins
// (RawConn.Read resets it), so the wait is armed first and the request
// written from inside it, after which no answer can slip by unseen. An
// error writing is werr (nothing was read); else n and rerr are what a
// Read would have returned (0 and io.EOF at the end). Over TLS it is a
// Write and a Read.
func (c *Conn) SendThenRead(head, body, p []byte) (n int, werr, rerr error) {
	if c.tls != nil || c.raw == nil {
		if werr = c.writeHeadBody(head, body); werr != nil {
			return 0, werr, nil
		}
		n, rerr = c.Read(p)
		return n, nil, rerr
	}
	sr := &c.sr
	if sr.step == nil {
		sr.step = c.sendThenReadStep
	}
	sr.bufs = [2][]byte{head, body}
	sr.p, sr.n, sr.sent, sr.werr, sr.rerr = p, 0, false, nil, nil
	err := c.raw.Read(sr.step)
	n, werr, rerr = sr.n, sr.werr, sr.rerr
	sr.bufs, sr.p, sr.werr, sr.rerr = [2][]byte{}, nil, nil, nil
	if werr != nil {
		return 0, werr, nil
	}
	if err != nil { // the poller's: a deadline, or the connection closed
		return 0, nil, &net.OpError{Op: "read", Net: "tcp", Source: c.tcp.LocalAddr(), Addr: c.tcp.RemoteAddr(), Err: err}
	}
	if rerr != nil {
		return 0, nil, &net.OpError{Op: "read", Net: "tcp", Source: c.tcp.LocalAddr(), Addr: c.tcp.RemoteAddr(), Err: os.NewSyscallError("read", rerr)}
	}
	if n == 0 {
		return 0, nil, io.EOF
	}
	return n, nil, nil
}

// sendThenReadStep is SendThenRead's RawConn.Read callback: the first
// call writes (a head alone as one raw write where the send buffer takes
// it whole, the rest through the socket's own Write, which takes the
// write lock and waits in the poller if the send buffer is full) and
// asks to wait; the calls after a wake read.
func (c *Conn) sendThenReadStep(fd uintptr) bool {
	sr := &c.sr
	if !sr.sent {
		sr.sent = true
		head, body := sr.bufs[0], sr.bufs[1]
		if len(body) == 0 {
			// The head alone, the common case: one raw write, which a
			// send buffer with room takes whole. Anything else (a part
			// taken, EAGAIN, an error) goes on through the socket's
			// Write, which waits in the poller, keeps the write deadline
			// and reports an error with the connection's addresses.
			n, err := nbio.Write(fd, head)
			if err == nil && n == len(head) {
				return false
			}
			head = head[n:]
		}
		sr.werr = c.writeHeadBody(head, body)
		return sr.werr != nil
	}
	for {
		n, err := nbio.Read(fd, sr.p)
		switch err {
		case nil:
			sr.n = n
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false // a wake with nothing to read: wait again
		}
		sr.rerr = err
		return true
	}
}

func (c *Conn) writeHeadBody(head, body []byte) error {
	if len(body) == 0 {
		_, err := c.Write(head)
		return err
	}
	// vec lives in c: a net.Buffers on the stack would escape through
	// WriteBuffers, an allocation per request.
	c.sr.vecArr = [2][]byte{head, body}
	c.sr.vec = c.sr.vecArr[:]
	_, err := c.WriteBuffers(&c.sr.vec)
	c.sr.vecArr, c.sr.vec = [2][]byte{}, nil
	return err
}

// SetDeadline, SetReadDeadline and SetWriteDeadline are the socket's. A
// TLS write that times out leaves the TLS session unusable: the
// connection must then be discarded, as any exchange cut short is.
func (c *Conn) SetDeadline(t time.Time) error {
	c.tryDeadline.Store(0)
	return c.tcp.SetDeadline(t)
}

func (c *Conn) SetReadDeadline(t time.Time) error {
	c.tryDeadline.Store(0)
	return c.tcp.SetReadDeadline(t)
}

func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.tryDeadline.Store(0)
	return c.tcp.SetWriteDeadline(t)
}

// SetTryDeadline bounds a try on c: both deadlines at t, or left where
// the connection's try before set them when nothing has moved them since
// and they are no earlier than t and at most slack later. Moving the
// deadlines changes two runtime timers, ~1.3 % of the CPU of an HTTP/1.1
// keep-alive request, and a busy pooled connection carries a request
// every millisecond or two; set at t+slack, one try's deadlines serve the
// tries of the next slack. A try so times out up to slack late, never
// early.
func (c *Conn) SetTryDeadline(t time.Time, slack time.Duration) {
	want := t.UnixNano()
	if d := c.tryDeadline.Load(); d != 0 && d >= want && d-want <= int64(slack) {
		return
	}
	d := t.Add(slack)
	c.tcp.SetDeadline(d)
	c.tryDeadline.Store(d.UnixNano())
}

// Stream is the connection to relay a tunnel over (an upgrade): the
// socket itself in plaintext, so that a copy between two sockets is
// splice(2); the TLS connection otherwise. The caller gives up the
// pooling of c: it ends with Discard.
func (c *Conn) Stream() Stream {
	c.tryDeadline.Store(0) // the deadlines are the stream's to set now
	if c.tls != nil {
		return c.tls
	}
	return c.tcp
}

// Endpoint is the address the connection goes to.
func (c *Conn) Endpoint() string { return c.addr }

// Reused reports whether the connection carried an earlier request. A
// request that fails on a reused connection before any byte of a response
// may have met a connection the upstream had already closed, and may be
// retried on a fresh one when repeating it is safe.
func (c *Conn) Reused() bool { return c.reused }

// EndpointIndex is the index of c's endpoint, for AcquireFresh.
func (c *Conn) EndpointIndex() int { return c.endpoint }

// Release ends the request's use of c. A connection whose last exchange
// left its framing beyond doubt goes back to the pool (keepAlive); any
// other is closed: after a 101, a body read until close, an exchange cut
// short, or any doubt about where the next response would start.
func (c *Conn) Release(keepAlive bool) {
	wc := c.wc
	wc.bal.finish(c.endpoint)
	if c.brk != nil {
		if c.holdsRequest {
			c.brk.requests.n.Add(-1)
			c.holdsRequest = false
		}
		if c.holdsRetry {
			c.brk.retries.n.Add(-1)
			c.holdsRetry = false
		}
	}
	if !keepAlive || wc.maxIdle == 0 {
		c.close()
		return
	}
	p := &wc.pool
	c.idleAt = monoNow()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.close()
		return
	}
	if p.idle == nil {
		p.idle = make([][]*Conn, wc.n)
	}
	q := p.idle[c.endpoint]
	if len(q) >= wc.maxIdle {
		p.mu.Unlock()
		c.close()
		return
	}
	p.idle[c.endpoint] = append(q, c)
	p.mu.Unlock()
}

// Discard closes c without pooling it (an exchange that failed).
func (c *Conn) Discard() { c.Release(false) }

func (c *Conn) close() {
	if c.counted != nil {
		c.counted.CxActive.Dec()
		c.counted = nil
	}
	if c.brk != nil {
		c.brk.connections.n.Add(-1)
		c.brk = nil
	}
	// A TLS connection is closed without a close_notify: crypto/tls
	// would wait up to 5s to send it behind a full send buffer (an
	// upstream that stopped reading), on a worker's goroutine. HTTP/1.1
	// framing never relies on it (RFC 9112 §9.8 tolerates an incomplete
	// close), and an idle pooled connection gets one (closeIdleConn).
	c.tcp.Close()
}

// closeIdleConn closes a pooled connection nobody uses: a TLS one says
// close_notify first, which cannot wait on an idle connection's empty
// send buffer for long (bounded by crypto/tls's 5s all the same).
func (c *Conn) closeIdleConn() {
	if c.tls != nil {
		c.tls.Close()
	}
	c.close()
}
