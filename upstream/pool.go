package upstream

import (
	"sync"
	"time"
)

// pool is one worker's idle connections to one cluster, by endpoint, most
// recently used last (LIFO: the warmest connection goes first, and the
// coldest age out).
//
// The goroutines of a worker's client connections share it, so a mutex
// guards it; it is held for a slice push or pop only, and no two workers
// ever touch the same pool.
type pool struct {
	mu     sync.Mutex // guards idle and closed
	idle   [][]*Conn  // by endpoint
	closed bool       // CloseIdle ran for good: nothing is pooled any more
}

var monoStart = time.Now()

func monoNow() int64 { return int64(time.Since(monoStart)) }

// takeIdle pops the most recently pooled connection to endpoint i that has
// not been idle longer than the cluster's idle timeout and still goes to
// addr, the endpoint's address now (its name may resolve elsewhere since);
// the others are closed on the way.
func (wc *WorkerCluster) takeIdle(i int, addr string, peekAfter time.Duration) *Conn {
	if wc.maxIdle == 0 {
		return nil
	}
	p := &wc.pool
	now := monoNow()
	var stale []*Conn
	var c *Conn
	p.mu.Lock()
	if p.idle != nil {
		q := p.idle[i]
		for len(q) > 0 {
			last := q[len(q)-1]
			q[len(q)-1] = nil
			q = q[:len(q)-1]
			idle := time.Duration(now - last.idleAt)
			if idle < wc.idleTimeout && last.addr == addr && (idle < peekAfter || !last.closedByPeer()) {
				c = last
				break
			}
			stale = append(stale, last)
		}
		p.idle[i] = q
	}
	p.mu.Unlock()
	for _, s := range stale {
		s.closeIdleConn()
	}
	if c != nil {
		c.reused = true
	}
	return c
}

// peekAfterIdle: Acquire reuses a connection idle for less than this
// without a peek. Upstreams close idle keep-alive connections after
// seconds, and one that closes after a response says so in it; the rare
// stale one left is caught by the retry of a safe request.
const peekAfterIdle = time.Second

// closedByPeer peeks at a pooled connection without waiting: an idle
// HTTP/1.1 connection has nothing to read, so EOF, an error or stray bytes
// all mean it must not carry a request. One syscall per reuse buys fewer
// requests sent into a connection the upstream already closed (which a
// non-idempotent request could not be retried from). A TLS connection is
// checked by a TLS read instead (tlsClosedByPeer says why).
func (c *Conn) closedByPeer() bool {
	if c.tls != nil {
		return c.tlsClosedByPeer()
	}
	c.stale = true
	c.raw.Control(c.peek)
	return c.stale
}

// closeIdle closes every pooled connection; with forGood, nothing is
// pooled afterwards either (the view is retired).
func (wc *WorkerCluster) closeIdle(forGood bool) {
	p := &wc.pool
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	if forGood {
		p.closed = true
	}
	p.mu.Unlock()
	for _, q := range idle {
		for _, c := range q {
			c.closeIdleConn()
		}
	}
}

// Name is the cluster's name.
func (wc *WorkerCluster) Name() string { return wc.name }

// IdleConns is the number of pooled connections (tests, admin).
func (wc *WorkerCluster) IdleConns() int {
	p := &wc.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, q := range p.idle {
		n += len(q)
	}
	return n
}
