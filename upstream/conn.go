package upstream

import (
	"net"
	"syscall"
)

// Conn is one HTTP/1.1 connection to an endpoint of a cluster, owned by the
// request that took it from its worker's pool until that request gives it
// back with Release. No goroutine watches a pooled connection: a stale one
// (closed by the upstream while idle) is found by the request that uses it
// next, which may retry on a fresh connection (see Reused).
type Conn struct {
	*net.TCPConn
	raw      syscall.RawConn // for the staleness peek, taken once
	peek     func(fd uintptr)
	stale    bool
	wc       *WorkerCluster
	endpoint int    // index of the endpoint in the cluster
	addr     string // the endpoint's address when it was dialed
	reused   bool   // taken from the pool, not freshly dialed
	idleAt   int64  // monotonic time it went back to the pool
	counted  *Stats
	// The circuit-breaker slots the connection holds: one of
	// max_connections while it is open (cx), one of max_requests (rq)
	// and, for a retry, one of max_retries while a request uses it.
	brk          *breakers
	holdsRequest bool
	holdsRetry   bool
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
	c.TCPConn.Close()
}
