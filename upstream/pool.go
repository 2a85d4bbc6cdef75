package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"
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

// Acquire returns a connection for one request: the balancer picks the
// endpoint, a pooled connection to it is reused when one is fresh enough,
// otherwise one is dialed within the connect timeout, trying the next
// endpoint when a connect fails. ctx aborts a dial (a forced drain). The
// caller must Release the connection when the exchange is over.
//
// A pooled connection idle for less than peekAfterIdle is handed out
// without a check; AcquireChecked is for requests that could not be
// retried if it turned out stale.
func (wc *WorkerCluster) Acquire(ctx context.Context) (*Conn, error) {
	return wc.acquireLimited(ctx, peekAfterIdle, 0, -1)
}

// AcquireKey is Acquire (checked: AcquireChecked) for a request whose
// hash_on key is key (HashKey; 0: none): a ring_hash or maglev cluster
// sends every request with the same key to the same endpoint while it is
// usable. Other policies ignore the key.
func (wc *WorkerCluster) AcquireKey(ctx context.Context, key uint64, checked bool) (*Conn, error) {
	peekAfter := peekAfterIdle
	if checked {
		peekAfter = 0
	}
	return wc.acquireLimited(ctx, peekAfter, key, -1)
}

// AcquireRetry returns a connection for a retry (retry_on) of a request
// whose previous try went to endpoint avoid: another endpoint when one is
// usable, chosen as AcquireKey would with avoid left out (a hashing
// policy takes the next endpoint on its ring or table, the same one on
// every worker). Every pooled connection is checked first. The retry
// holds one of max_retries (and of max_requests) until it is released;
// past max_retries it fails at once with an OverflowError.
func (wc *WorkerCluster) AcquireRetry(ctx context.Context, key uint64, avoid int) (*Conn, error) {
	if wc.n == 0 {
		return nil, fmt.Errorf("cluster %q: %w", wc.name, ErrNoEndpoint)
	}
	brk := wc.state.breakers
	if brk != nil {
		if !take(&brk.retries, brk.maxRetries) {
			wc.countOverflow(false)
			return nil, brk.errRetries
		}
		if !take(&brk.requests, brk.maxRequests) {
			brk.retries.n.Add(-1)
			wc.countOverflow(false)
			return nil, brk.errRequests
		}
	}
	c, err := wc.acquire(ctx, brk, 0, key, avoid)
	if brk != nil {
		if err != nil {
			brk.retries.n.Add(-1)
			brk.requests.n.Add(-1)
		} else {
			c.holdsRequest, c.holdsRetry = true, true
		}
	}
	return c, err
}

// AcquireChecked is Acquire for a request that cannot be sent twice (not
// idempotent, or with a body streamed from the client): every pooled
// connection is checked for a close by the upstream first, one syscall.
func (wc *WorkerCluster) AcquireChecked(ctx context.Context) (*Conn, error) {
	return wc.acquireLimited(ctx, 0, 0, -1)
}

// acquireLimited is Acquire within the circuit breakers.
func (wc *WorkerCluster) acquireLimited(ctx context.Context, peekAfter time.Duration, key uint64, avoid int) (*Conn, error) {
	if wc.n == 0 {
		return nil, fmt.Errorf("cluster %q: %w", wc.name, ErrNoEndpoint)
	}
	brk := wc.state.breakers
	if brk != nil && !take(&brk.requests, brk.maxRequests) {
		wc.countOverflow(false)
		return nil, brk.errRequests
	}
	c, err := wc.acquire(ctx, brk, peekAfter, key, avoid)
	if brk != nil {
		if err != nil {
			brk.requests.n.Add(-1)
		} else {
			c.holdsRequest = true
		}
	}
	return c, err
}

// acquire picks an endpoint for key (0: none), the next usable one when
// the pick is avoid (an endpoint index; -1: none) and there is another,
// and returns a pooled or new connection to it, trying the next endpoints
// (but avoid) when a connect fails.
func (wc *WorkerCluster) acquire(ctx context.Context, brk *breakers, peekAfter time.Duration, key uint64, avoid int) (*Conn, error) {
	hs := wc.hosts()
	usable := hs.usable
	n := len(usable)
	first := wc.bal.pick(usable, key)
	if n > 1 && int(usable[first]) == avoid {
		first = (first + 1) % n
	}
	if i := int(usable[first]); wc.maxIdle > 0 {
		if c := wc.takeIdle(i, hs.addrs[i], peekAfter); c != nil {
			wc.bal.start(i)
			return c, nil
		}
	}
	if brk != nil {
		// The request now waits for a connection of its own.
		if !take(&brk.pending, brk.maxPending) {
			wc.countOverflow(false)
			return nil, brk.errPending
		}
		defer brk.pending.n.Add(-1)
	}
	var tried []string
	var last error
	for k := range n {
		i := int(usable[(first+k)%n])
		if i == avoid && n > 1 {
			continue // the retry's previous try went there
		}
		c, err := wc.dial(ctx, i, hs.addrs[i])
		if err == nil {
			wc.bal.start(i)
			return c, nil
		}
		if errors.Is(err, ErrOverflow) {
			return nil, err
		}
		tried = append(tried, hs.addrs[i])
		last = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, &ConnectError{Cluster: wc.name, Tried: tried, Err: last}
}

// countOverflow counts a request refused by a circuit breaker: cx for
// max_connections, otherwise a request breaker.
func (wc *WorkerCluster) countOverflow(cx bool) {
	st := wc.stats.Load()
	if st == nil {
		return
	}
	if cx {
		st.CxOverflow.Inc()
	} else {
		st.RqPendingOverflow.Inc()
	}
}

// AcquireFresh dials a new connection to the endpoint of c's cluster that c
// went to, for the retry of a request that met a stale pooled connection.
// c is not released by it. The retry holds one of max_retries (and of
// max_requests) until it is released.
func (wc *WorkerCluster) AcquireFresh(ctx context.Context, endpoint int) (*Conn, error) {
	brk := wc.state.breakers
	if brk != nil {
		if !take(&brk.retries, brk.maxRetries) {
			wc.countOverflow(false)
			return nil, brk.errRetries
		}
		if !take(&brk.requests, brk.maxRequests) {
			brk.retries.n.Add(-1)
			wc.countOverflow(false)
			return nil, brk.errRequests
		}
	}
	addr := wc.state.hosts.Load().addrs[endpoint]
	c, err := wc.dial(ctx, endpoint, addr)
	if err != nil {
		if brk != nil {
			brk.retries.n.Add(-1)
			brk.requests.n.Add(-1)
		}
		if errors.Is(err, ErrOverflow) {
			return nil, err
		}
		return nil, &ConnectError{Cluster: wc.name, Tried: []string{addr}, Err: err}
	}
	if brk != nil {
		c.holdsRequest, c.holdsRetry = true, true
	}
	wc.bal.start(endpoint)
	return c, nil
}

// EndpointIndex is the index of c's endpoint, for AcquireFresh.
func (c *Conn) EndpointIndex() int { return c.endpoint }

func (wc *WorkerCluster) dial(ctx context.Context, i int, addr string) (*Conn, error) {
	brk := wc.state.breakers
	if brk != nil && !take(&brk.connections, brk.maxConnections) {
		wc.countOverflow(true)
		return nil, brk.errConnections
	}
	nc, err := wc.dialer.DialContext(ctx, "tcp", addr)
	st := wc.stats.Load()
	if err != nil {
		if brk != nil {
			brk.connections.n.Add(-1)
		}
		if ctx.Err() == nil {
			// A connect abandoned by the caller is not the
			// endpoint's failure.
			if st != nil {
				st.CxConnectFail.Inc()
			}
			wc.reportConnect(i, false)
		}
		return nil, err
	}
	wc.reportConnect(i, true)
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		if brk != nil {
			brk.connections.n.Add(-1)
		}
		return nil, errors.New("upstream: dial returned a non-TCP connection")
	}
	if st != nil {
		st.CxTotal.Inc()
		st.CxActive.Inc()
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		tc.Close()
		if brk != nil {
			brk.connections.n.Add(-1)
		}
		return nil, err
	}
	c := &Conn{TCPConn: tc, raw: raw, wc: wc, endpoint: i, addr: addr, counted: st, brk: brk}
	c.peek = func(fd uintptr) { c.stale = peerClosed(fd) }
	return c, nil
}

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
		s.close()
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
// non-idempotent request could not be retried from).
func (c *Conn) closedByPeer() bool {
	c.stale = true
	c.raw.Control(c.peek)
	return c.stale
}

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
			c.close()
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

// CountRetry counts a retry of a request (retry_on), in
// upstream_rq_retry.
func (wc *WorkerCluster) CountRetry() {
	if st := wc.stats.Load(); st != nil {
		st.RqRetry.Inc()
	}
}

// CountRetrySuccess counts a retried request whose last try got a
// response that was not retried, in upstream_rq_retry_success.
func (wc *WorkerCluster) CountRetrySuccess() {
	if st := wc.stats.Load(); st != nil {
		st.RqRetrySuccess.Inc()
	}
}

// RecordRequest counts one request sent to the cluster and, once its
// response head has arrived (ok), the time it took.
func (wc *WorkerCluster) RecordRequest(start time.Time, ok bool) {
	st := wc.stats.Load()
	if st == nil {
		return
	}
	st.RqTotal.Inc()
	if ok {
		st.RqTime.Record(msSince(start))
	}
}
