package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/net/http2"

	"github.com/hotproxy/hotproxy/config"
)

// H2Pool is the HTTP/2 multiplexed pool: the HTTP/2 client connections
// of one worker's view of a cluster (clusters.http2 = true), by
// endpoint, behind golang.org/x/net/http2's Transport. The transport's
// RoundTrip asks its ConnPool for a connection for every request (and
// again when a connection turned out unusable before the request went
// out: a GOAWAY, a refused stream); the pool picks the endpoint there
// with the cluster's balancer for the request's try (H2Try, in the
// request's context) and returns a connection to it that can take one
// more stream, dialing one when none can.
type H2Pool struct {
	wc     *WorkerCluster
	t      *http2.Transport
	scheme string // "http" (prior knowledge) or "https"

	mu sync.Mutex // guards the fields below
	// connsByEndpoint are the connections that may take new requests;
	// endpointOf holds every open one (retired ones too, until they
	// close), for CloseIdle and CloseAll.
	connsByEndpoint map[int][]*http2.ClientConn
	endpointOf      map[*http2.ClientConn]h2Where
	dialing         map[int]*h2Dial // the dial under way to an endpoint
	closed          bool            // the Manager is closed: no new connection
}

// h2Where is where a connection goes: the endpoint and its address when
// it was dialed (a name of the endpoint may resolve elsewhere since).
type h2Where struct {
	endpoint int
	addr     string
}

// h2Dial is a dial under way, which the requests that want a connection to
// the same endpoint wait for rather than dial too.
type h2Dial struct {
	done chan struct{}
	err  error // set before done is closed
}

var _ http2.ClientConnPool = (*H2Pool)(nil)

// H2PoolOptions is a cluster's HTTP/2 transport, compiled; the zero
// value is cleartext with prior knowledge and no idle timeout.
type H2PoolOptions struct {
	TLS         bool          // the cluster's tls: ALPN h2
	IdleTimeout time.Duration // a connection idle this long closes
}

// NewH2Pool returns the HTTP/2 pool of worker cluster view wc.
func NewH2Pool(wc *WorkerCluster, opts H2PoolOptions) *H2Pool {
	u := &H2Pool{
		wc:              wc,
		scheme:          "http",
		connsByEndpoint: make(map[int][]*http2.ClientConn),
		endpointOf:      make(map[*http2.ClientConn]h2Where),
		dialing:         make(map[int]*h2Dial),
	}
	if opts.TLS {
		u.scheme = "https"
	}
	u.t = &http2.Transport{
		AllowHTTP: true,
		// Accept-Encoding and the body pass as they are: the transport
		// must not ask for gzip and decode it behind the client's back.
		DisableCompression: true,
		// A connection idle this long closes itself (and leaves the
		// pool through MarkDead).
		IdleConnTimeout: opts.IdleTimeout,
		ConnPool:        u,
	}
	return u
}

// H2Try is one try of a request, as the pool sees it: what to pick with,
// and what it picked. A request reaches the pool with its try in its
// context (WithH2Try).
type H2Try struct {
	Key   uint64 // hash_on key; 0: none
	Avoid int    // the previous try's endpoint; -1: none
	Retry bool   // holds one of max_retries

	Endpoint int    // picked; -1: none yet
	Addr     string // its address
	end      func() // ends the request's count at endpoint (StartRequest)
}

type h2TryKey struct{}

// WithH2Try returns ctx carrying try, for a request to RoundTrip.
func WithH2Try(ctx context.Context, try *H2Try) context.Context {
	return context.WithValue(ctx, h2TryKey{}, try)
}

// Finish ends the try's count at its endpoint, if it has one.
func (t *H2Try) Finish() {
	if t.end != nil {
		t.end()
		t.end = nil
	}
}

// GetClientConn is the transport's question for each request (addr, the
// cluster's name, means nothing): the endpoint is picked for the try in
// req's context, the next ones tried when a connect fails.
func (u *H2Pool) GetClientConn(req *http.Request, _ string) (*http2.ClientConn, error) {
	ctx := req.Context()
	try, _ := ctx.Value(h2TryKey{}).(*H2Try)
	if try == nil {
		return nil, errors.New("HTTP/2 upstream: a request without its try (a bug)")
	}
	// The transport asks again for a request that a connection did
	// not take: pick afresh.
	try.Finish()
	if err := ctx.Err(); err != nil {
		return nil, err // the client reset the stream: dial nothing
	}
	order, err := u.wc.PickEndpoints(try.Key, try.Avoid)
	if err != nil {
		return nil, err
	}
	var tried []string
	var last error
	for _, i := range order {
		end, err := u.wc.StartRequest(i, try.Retry)
		if err != nil {
			return nil, err // a circuit breaker: at once
		}
		cc, err := u.clientConnTo(ctx, i)
		if err == nil {
			try.Endpoint, try.Addr, try.end = i, u.wc.Address(i), end
			return cc, nil
		}
		end()
		var ce *ConnectError
		if !errors.As(err, &ce) {
			return nil, err // overflow, closed
		}
		tried = append(tried, ce.Tried...)
		last = ce.Err
		if ctx.Err() != nil {
			break // the caller gave up; the others are not to blame
		}
	}
	return nil, &ConnectError{Cluster: u.wc.Name(), Tried: tried, Err: last}
}

// clientConnTo returns a connection to endpoint i with a stream reserved
// for the request: one of those open when it can take another stream,
// otherwise a new one. Requests that find a dial to i under way wait for
// it rather than dial too, so a burst opens one connection, not one each,
// and share its failure: a black-holed endpoint costs them one connect
// timeout, not one each in turn.
func (u *H2Pool) clientConnTo(ctx context.Context, i int) (*http2.ClientConn, error) {
	addr := u.wc.Address(i)
	var d *h2Dial
	for d == nil {
		u.mu.Lock()
		if u.closed {
			u.mu.Unlock()
			return nil, net.ErrClosed
		}
		for _, cc := range u.connsByEndpoint[i] {
			if u.endpointOf[cc].addr != addr {
				// The endpoint's name resolves elsewhere now: the
				// connection takes no new request, and closes when
				// idle.
				u.retireLocked(cc)
				continue
			}
			if cc.ReserveNewRequest() {
				u.mu.Unlock()
				return cc, nil
			}
		}
		other := u.dialing[i]
		if other == nil {
			d = &h2Dial{done: make(chan struct{})}
			u.dialing[i] = d
		}
		u.mu.Unlock()
		if other == nil {
			break
		}
		select {
		case <-other.done:
			if other.err != nil {
				return nil, other.err
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	cc, err := u.dial(ctx, i, addr)
	u.mu.Lock()
	if err == nil && u.closed {
		err = net.ErrClosed
	}
	if err == nil && !cc.ReserveNewRequest() {
		err = &ConnectError{Cluster: u.wc.Name(), Tried: []string{addr},
			Err: errors.New("the new HTTP/2 connection takes no stream")}
	}
	if err == nil {
		u.connsByEndpoint[i] = append(u.connsByEndpoint[i], cc)
		u.endpointOf[cc] = h2Where{i, addr}
	}
	var ce *ConnectError
	if errors.As(err, &ce) && ctx.Err() == nil {
		// The waiters' answer too; a dial this request abandoned
		// is not the endpoint's failure.
		d.err = err
	}
	delete(u.dialing, i)
	close(d.done)
	u.mu.Unlock()
	if err != nil {
		if cc != nil {
			cc.Close()
		}
		return nil, err
	}
	return cc, nil
}

// dial opens an HTTP/2 connection to endpoint i.
func (u *H2Pool) dial(ctx context.Context, i int, addr string) (*http2.ClientConn, error) {
	c, err := u.wc.DialEndpoint(ctx, i)
	if err != nil {
		return nil, err
	}
	// A TLS cluster's connection did its handshake offering ALPN h2
	// only, since the cluster says http2 (upstream/tls.go).
	if tc, ok := c.(interface{ ConnectionState() tls.ConnectionState }); ok {
		if p := tc.ConnectionState().NegotiatedProtocol; p != config.ALPNHTTP2 {
			c.Close()
			return nil, &ConnectError{Cluster: u.wc.Name(), Tried: []string{addr},
				Err: fmt.Errorf("ALPN chose %q, not h2 (the upstream does not speak HTTP/2 over TLS; remove clusters.http2)", p)}
		}
	}
	cc, err := u.t.NewClientConn(c)
	if err != nil {
		c.Close()
		return nil, &ConnectError{Cluster: u.wc.Name(), Tried: []string{addr}, Err: err}
	}
	return cc, nil
}

// MarkDead takes a connection that ended (or will take no new stream) out
// of the pool; the transport calls it.
func (u *H2Pool) MarkDead(cc *http2.ClientConn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.forgetLocked(cc)
}

// forgetLocked takes cc out of the pool for good.
func (u *H2Pool) forgetLocked(cc *http2.ClientConn) {
	u.retireLocked(cc)
	delete(u.endpointOf, cc)
}

// retireLocked stops cc from taking new requests; CloseIdle and CloseAll
// still see it.
func (u *H2Pool) retireLocked(cc *http2.ClientConn) {
	w, ok := u.endpointOf[cc]
	if !ok {
		return
	}
	conns := u.connsByEndpoint[w.endpoint]
	for k, c := range conns {
		if c == cc {
			conns = append(conns[:k], conns[k+1:]...)
			break
		}
	}
	if len(conns) == 0 {
		delete(u.connsByEndpoint, w.endpoint)
	} else {
		u.connsByEndpoint[w.endpoint] = conns
	}
}

// RoundTrip sends req (whose context carries its H2Try) on a connection
// of the pool and returns the response.
func (u *H2Pool) RoundTrip(req *http.Request) (*http.Response, error) { return u.t.RoundTrip(req) }

// Cluster is the worker cluster view the pool dials for.
func (u *H2Pool) Cluster() *WorkerCluster { return u.wc }

// Scheme is the pool's URL scheme: "http" (prior knowledge) or "https".
func (u *H2Pool) Scheme() string { return u.scheme }

// CloseIdle closes the connections that carry no stream and have none
// reserved (a drain; a retired view). Reservations are made under u.mu,
// so none can slip in between the look and the close.
func (u *H2Pool) CloseIdle() {
	var idle []*http2.ClientConn
	u.mu.Lock()
	for cc := range u.endpointOf {
		if st := cc.State(); st.StreamsActive+st.StreamsReserved+st.StreamsPending == 0 {
			idle = append(idle, cc)
			u.forgetLocked(cc)
		}
	}
	u.mu.Unlock()
	for _, cc := range idle {
		cc.Close()
	}
}

// CloseAll closes every connection of u, busy or idle, and refuses any
// new one.
func (u *H2Pool) CloseAll() {
	u.mu.Lock()
	u.closed = true
	conns := make([]*http2.ClientConn, 0, len(u.endpointOf))
	for cc := range u.endpointOf {
		conns = append(conns, cc)
		u.forgetLocked(cc)
	}
	u.mu.Unlock()
	for _, cc := range conns {
		cc.Close()
	}
}
