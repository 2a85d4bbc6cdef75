package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
)

// Multiplexed upstreams (HTTP/2): a request does not own a connection, it
// takes a stream on a long-lived connection to the endpoint the balancer
// picked for it. So the pick (PickEndpoints), the connection
// (DialEndpoint) and the request's bookkeeping (StartRequest) are apart:
// the caller keeps its connections per endpoint and picks per request.

// PickEndpoints returns the usable endpoints (indices) in the order a
// request whose hash_on key is key (HashKey; 0: none) should try them:
// the balancer's pick first, then the next ones. avoid (an endpoint
// index; -1: none), the endpoint of a retry's previous try, is left out
// when there is another. It fails with ErrNoEndpoint for a cluster with
// none.
func (wc *WorkerCluster) PickEndpoints(key uint64, avoid int) ([]int, error) {
	return wc.pickEndpointsInto(nil, key, avoid)
}

// pickEndpointsInto is PickEndpoints appending to dst[:0], so that a
// caller with a buffer of its own allocates nothing.
func (wc *WorkerCluster) pickEndpointsInto(dst []int, key uint64, avoid int) ([]int, error) {
	if wc.n == 0 {
		return nil, fmt.Errorf("cluster %q: %w", wc.name, ErrNoEndpoint)
	}
	usable := wc.hosts().usable
	n := len(usable)
	first := wc.bal.pick(usable, key)
	order := dst[:0]
	if order == nil {
		order = make([]int, 0, n)
	}
	for k := range n {
		i := int(usable[(first+k)%n])
		if i == avoid && n > 1 {
			continue
		}
		order = append(order, i)
	}
	return order, nil
}

// Address is endpoint i's current address.
func (wc *WorkerCluster) Address(i int) string {
	return wc.state.hosts.Load().addrs[i]
}

// DialEndpoint opens a connection to endpoint i for requests multiplexed
// on it: the connect (and TLS handshake, with the cluster's ALPN) within
// the connect timeout, max_connections, max_pending while it is made,
// upstream_cx_* and outlier detection's connect failures, as for a pooled
// HTTP/1.1 connection. A failed connect is a *ConnectError naming the
// endpoint. Closing the connection gives its max_connections slot back.
func (wc *WorkerCluster) DialEndpoint(ctx context.Context, i int) (net.Conn, error) {
	brk := wc.state.breakers
	if brk != nil {
		// The request waits for a connection of its own.
		if !take(&brk.pending, brk.maxPending) {
			wc.countOverflow(false)
			return nil, brk.errPending
		}
		defer brk.pending.n.Add(-1)
	}
	addr := wc.Address(i)
	c, err := wc.dial(ctx, i, addr)
	if err != nil {
		if errors.Is(err, ErrOverflow) {
			return nil, err
		}
		return nil, &ConnectError{Cluster: wc.name, Tried: []string{addr}, Err: err}
	}
	return &multiplexedConn{Stream: c.Stream(), c: c}, nil
}

// multiplexedConn is a connection of DialEndpoint: its Close ends what
// dial counted (upstream_cx_active, max_connections) once; the balancer
// and the request breakers count requests, not it.
type multiplexedConn struct {
	Stream
	c    *Conn
	once sync.Once
}

func (m *multiplexedConn) Close() error {
	m.once.Do(m.c.close)
	return nil
}

// StartRequest counts a request sent to endpoint i on a multiplexed
// connection: within max_requests (and max_retries for a retry), and in
// least_request's count of endpoint i. end, called once when the
// response is done with, gives it all back. Past a breaker it fails at
// once with an OverflowError.
func (wc *WorkerCluster) StartRequest(i int, retry bool) (end func(), err error) {
	if err := wc.startStream(i, retry); err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { wc.endStream(i, retry) }) }, nil
}

// startStream is StartRequest without the closure: endStream(i, retry),
// called exactly once, gives it back.
func (wc *WorkerCluster) startStream(i int, retry bool) error {
	brk := wc.state.breakers
	if brk != nil {
		if retry && !take(&brk.retries, brk.maxRetries) {
			wc.countOverflow(false)
			return brk.errRetries
		}
		if !take(&brk.requests, brk.maxRequests) {
			if retry {
				brk.retries.n.Add(-1)
			}
			wc.countOverflow(false)
			return brk.errRequests
		}
	}
	wc.bal.start(i)
	return nil
}

func (wc *WorkerCluster) endStream(i int, retry bool) {
	wc.bal.finish(i)
	if brk := wc.state.breakers; brk != nil {
		brk.requests.n.Add(-1)
		if retry {
			brk.retries.n.Add(-1)
		}
	}
}
