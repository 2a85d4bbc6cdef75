package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

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

// AcquireTry is the connection for try n (0: the first) of a request
// whose hash_on key is key, as a retry policy asks for it
// (exchange.UpstreamTransport): the first try takes a pooled connection
// (checked first unless replayable: a request that could not be sent
// again if it met a stale one); a retry goes to another endpoint than
// avoid's, or, when fresh, to a new connection to endpoint avoid (the
// stale connection's).
func (wc *WorkerCluster) AcquireTry(ctx context.Context, key uint64, n, avoid int, fresh, replayable bool) (*Conn, error) {
	switch {
	case n == 0:
		return wc.AcquireKey(ctx, key, !replayable)
	case fresh:
		return wc.AcquireFresh(ctx, avoid)
	}
	return wc.AcquireRetry(ctx, key, avoid)
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

// dial opens a new connection to endpoint i at addr: the TCP connect and,
// for a TLS cluster, the handshake, both within the connect timeout. A
// failed handshake is a failed connect (counted, reported to outlier
// detection, the next endpoint tried by the caller).
func (wc *WorkerCluster) dial(ctx context.Context, i int, addr string) (*Conn, error) {
	brk := wc.state.breakers
	if brk != nil && !take(&brk.connections, brk.maxConnections) {
		wc.countOverflow(true)
		return nil, brk.errConnections
	}
	deadline := wc.connectDeadline()
	nc, err := wc.dialer.DialContext(ctx, "tcp", addr)
	st := wc.stats.Load()
	if err != nil {
		wc.connectFailed(ctx, i, brk, st)
		return nil, err
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		if brk != nil {
			brk.connections.n.Add(-1)
		}
		return nil, errors.New("upstream: dial returned a non-TCP connection")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		tc.Close()
		if brk != nil {
			brk.connections.n.Add(-1)
		}
		return nil, err
	}
	c := &Conn{tcp: tc, raw: raw, wc: wc, endpoint: i, addr: addr, brk: brk}
	if wc.tls != nil {
		c.tls, c.transport, err = wc.handshake(ctx, tc, raw, i, deadline, st)
		if err != nil {
			wc.connectFailed(ctx, i, brk, st)
			return nil, err
		}
	}
	wc.reportConnect(i, true)
	if st != nil {
		st.CxTotal.Inc()
		st.CxActive.Inc()
	}
	c.counted = st
	c.peek = func(fd uintptr) { c.stale = peerClosed(fd) }
	return c, nil
}

// connectFailed gives back the max_connections slot of a connect that
// failed and, unless the caller abandoned it (ctx ended: not the
// endpoint's failure), counts it and reports it to outlier detection.
func (wc *WorkerCluster) connectFailed(ctx context.Context, i int, brk *breakers, st *Stats) {
	if brk != nil {
		brk.connections.n.Add(-1)
	}
	if ctx.Err() == nil {
		if st != nil {
			st.CxConnectFail.Inc()
		}
		wc.reportConnect(i, false)
	}
}
