package upstream

import (
	"crypto/tls"
	"net"
	"syscall"
	"time"
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

// SetDeadline, SetReadDeadline and SetWriteDeadline are the socket's. A
// TLS write that times out leaves the TLS session unusable: the
// connection must then be discarded, as any exchange cut short is.
func (c *Conn) SetDeadline(t time.Time) error      { return c.tcp.SetDeadline(t) }
func (c *Conn) SetReadDeadline(t time.Time) error  { return c.tcp.SetReadDeadline(t) }
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.tcp.SetWriteDeadline(t) }

// Stream is the connection to relay a tunnel over (an upgrade): the
// socket itself in plaintext, so that a copy between two sockets is
// splice(2); the TLS connection otherwise. The caller gives up the
// pooling of c: it ends with Discard.
func (c *Conn) Stream() Stream {
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
