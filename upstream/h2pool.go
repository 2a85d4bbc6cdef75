package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/h2"
)

// H2Pool is the HTTP/2 multiplexed pool: the HTTP/2 client connections
// (h2's ClientConn) of one worker's view of a cluster
// (clusters.http2 = true), by endpoint. Each try of a request asks Open
// for a stream: the cluster's balancer picks the endpoint for it (health,
// ejection, hash_on keys, avoiding the previous try's endpoint), and the
// stream goes on a connection to it that can take one more, dialed when
// none can. A connection that received GOAWAY, died, or whose endpoint
// now resolves elsewhere takes no new stream; one idle for the cluster's
// idle_timeout closes itself.
type H2Pool struct {
	wc     *WorkerCluster
	scheme string // "http" (prior knowledge) or "https"
	cfg    h2.ClientConfig

	mu sync.Mutex // guards the fields below
	// connsByEndpoint are the connections that may take new streams;
	// all holds every open one (retired ones too, until they close),
	// for CloseIdle and CloseAll.
	connsByEndpoint map[int][]*h2PoolConn
	all             map[*h2.ClientConn]*h2PoolConn
	dialing         map[int]*h2Dial // the dial under way to an endpoint
	closed          bool            // the Manager is closed: no new connection
}

// h2PoolConn is one connection of the pool and where it goes: the
// endpoint and its address when it was dialed (a name of the endpoint
// may resolve elsewhere since).
type h2PoolConn struct {
	cc       *h2.ClientConn
	endpoint int
	addr     string
	// opening counts the OpenStream calls under way on cc (guarded by
	// H2Pool.mu): CloseIdle leaves a connection about to take a stream
	// alone.
	opening int
}

// h2Dial is a dial under way, which the tries that want a connection to
// the same endpoint wait for rather than dial too.
type h2Dial struct {
	done chan struct{}
	err  error // set before done is closed
}

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
		cfg:             h2.ClientConfig{IdleTimeout: opts.IdleTimeout},
		connsByEndpoint: make(map[int][]*h2PoolConn),
		all:             make(map[*h2.ClientConn]*h2PoolConn),
		dialing:         make(map[int]*h2Dial),
	}
	if opts.TLS {
		u.scheme = "https"
	}
	return u
}

// H2Stream is one try's stream, as Open leaves it: the stream, and the
// endpoint it went to. Its zero value holds nothing; Finish ends it.
type H2Stream struct {
	Stream   *h2.ClientStream // nil: Open failed
	Endpoint int              // -1: none picked
	Addr     string           // the endpoint's address; "": none

	counted bool // startStream was called for Endpoint
	retry   bool
	wc      *WorkerCluster
	order   []int // Open's pick, kept to allocate nothing per try
}

// Finish releases the stream (reset with CANCEL if it is still open) and
// ends the try's count at its endpoint. It is idempotent.
func (s *H2Stream) Finish() {
	if s.Stream != nil {
		s.Stream.Release()
		s.Stream = nil
	}
	if s.counted {
		s.counted = false
		s.wc.endStream(s.Endpoint, s.retry)
	}
}

// h2MaxOpenAttempts bounds how many connections one endpoint's stream is
// offered to when each in turn refuses it (a GOAWAY, MAX_CONCURRENT_STREAMS
// reached between the look and the open).
const h2MaxOpenAttempts = 4

// Open sends head on a new stream to an endpoint the balancer picks for
// key, avoiding endpoint avoid (-1: none); retry says the try holds one
// of max_retries. Endpoints are tried in the balancer's order while their
// connect fails; dials end with ctx or at deadline. The result is in out
// (whose earlier stream must have been finished): on success out.Stream
// is open and must be finished by the caller; on failure out says the
// endpoint that was reached, if any. A connect that failed on every
// endpoint is a *ConnectError; a circuit breaker's refusal an
// OverflowError.
func (u *H2Pool) Open(ctx context.Context, key uint64, avoid int, retry bool, deadline time.Time, head *h2.RequestHead, out *H2Stream) error {
	*out = H2Stream{Endpoint: -1, wc: u.wc, retry: retry, order: out.order}
	if err := ctx.Err(); err != nil {
		return err // the client went away: dial nothing
	}
	order, err := u.wc.pickEndpointsInto(out.order, key, avoid)
	out.order = order
	if err != nil {
		return err
	}
	var tried []string
	var last error
	for _, i := range order {
		if err := u.wc.startStream(i, retry); err != nil {
			return err // a circuit breaker: at once
		}
		s, err := u.openOn(ctx, i, deadline, head)
		if err == nil {
			out.Stream, out.Endpoint, out.Addr, out.counted = s, i, u.wc.Address(i), true
			return nil
		}
		u.wc.endStream(i, retry)
		var ce *ConnectError
		if !errors.As(err, &ce) {
			// Sent (or refused as unsendable): the endpoint was reached.
			out.Endpoint, out.Addr = i, u.wc.Address(i)
			return err
		}
		tried = append(tried, ce.Tried...)
		last = ce.Err
		if ctx.Err() != nil || !time.Now().Before(deadline) {
			break // the caller gave up; the others are not to blame
		}
	}
	return &ConnectError{Cluster: u.wc.Name(), Tried: tried, Err: last}
}

// openOn opens a stream for head on a connection to endpoint i. A
// connection that refuses it (h2.ErrRefused: nothing was sent) is retired
// and the next one tried, a new one dialed when none is left.
func (u *H2Pool) openOn(ctx context.Context, i int, deadline time.Time, head *h2.RequestHead) (*h2.ClientStream, error) {
	var err error
	for range h2MaxOpenAttempts {
		var pc *h2PoolConn
		pc, err = u.connTo(ctx, i, deadline)
		if err != nil {
			return nil, err
		}
		var s *h2.ClientStream
		s, err = pc.cc.OpenStream(head)
		u.mu.Lock()
		pc.opening--
		if errors.Is(err, h2.ErrRefused) {
			u.retireLocked(pc)
		}
		u.mu.Unlock()
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, h2.ErrRefused) {
			return nil, err
		}
	}
	return nil, err
}

// connTo returns a connection to endpoint i that can take a stream now,
// counted in its opening: one of those open, otherwise a new one. Tries
// that find a dial to i under way wait for it rather than dial too, so a
// burst opens one connection, not one each, and shares its failure: a
// black-holed endpoint costs them one connect timeout, not one each in
// turn.
func (u *H2Pool) connTo(ctx context.Context, i int, deadline time.Time) (*h2PoolConn, error) {
	addr := u.wc.Address(i)
	var d *h2Dial
	for d == nil {
		u.mu.Lock()
		if u.closed {
			u.mu.Unlock()
			return nil, net.ErrClosed
		}
		for k := 0; k < len(u.connsByEndpoint[i]); {
			pc := u.connsByEndpoint[i][k]
			switch {
			case pc.addr != addr || !pc.cc.CanTakeNewStream():
				// Gone away, dead, at its stream limit for now, or the
				// endpoint's name resolves elsewhere: a connection that
				// may take streams again stays; the others retire
				// and close when idle.
				if pc.addr != addr || !h2Usable(pc.cc) {
					u.retireLocked(pc)
					continue
				}
				k++
			default:
				pc.opening++
				u.mu.Unlock()
				return pc, nil
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
	dctx, cancel := context.WithDeadline(ctx, deadline)
	pc, err := u.dial(dctx, i, addr)
	cancel()
	u.mu.Lock()
	if err == nil && u.closed {
		err = net.ErrClosed
	}
	if err == nil {
		u.connsByEndpoint[i] = append(u.connsByEndpoint[i], pc)
		u.all[pc.cc] = pc
		pc.opening++
		select {
		case <-pc.cc.Done():
			// Died before it was in the pool: its Dead event found
			// nothing to forget.
			u.forgetLocked(pc)
		default:
		}
	}
	var ce *ConnectError
	if errors.As(err, &ce) && ctx.Err() == nil {
		// The waiters' answer too; a dial this try abandoned is not the
		// endpoint's failure.
		d.err = err
	}
	delete(u.dialing, i)
	close(d.done)
	u.mu.Unlock()
	if err != nil {
		if pc != nil {
			pc.cc.Close()
		}
		return nil, err
	}
	return pc, nil
}

// h2Usable: cc may take streams again later (it is only at the peer's
// MAX_CONCURRENT_STREAMS), as opposed to dead or going away (whose GOAWAY
// event retired it already; a connection refusing with no stream open is
// going away too).
func h2Usable(cc *h2.ClientConn) bool {
	select {
	case <-cc.Done():
		return false
	default:
	}
	return cc.ActiveStreams() > 0
}

// dial opens an HTTP/2 connection to endpoint i.
func (u *H2Pool) dial(ctx context.Context, i int, addr string) (*h2PoolConn, error) {
	c, err := u.wc.DialEndpoint(ctx, i)
	if err != nil {
		return nil, err
	}
	// A TLS cluster's connection did its handshake offering ALPN h2
	// only, since the cluster says http2 (upstream/tls.go); a server
	// that knows no ALPN completes it choosing nothing.
	if tc := tlsConnOf(c); tc != nil {
		if p := tc.ConnectionState().NegotiatedProtocol; p != config.ALPNHTTP2 {
			c.Close()
			return nil, &ConnectError{Cluster: u.wc.Name(), Tried: []string{addr},
				Err: fmt.Errorf("ALPN chose %q, not h2 (the upstream does not speak HTTP/2 over TLS; remove clusters.http2, or enable h2 on the upstream)", p)}
		}
	}
	pc := &h2PoolConn{endpoint: i, addr: addr}
	// Dead may run before NewClientConn returns (a peer that closes at
	// once): then connTo sees the connection done and forgets it.
	var self atomic.Pointer[h2PoolConn]
	cfg := u.cfg
	cfg.Events.Dead = func(error) {
		if pc := self.Load(); pc != nil {
			u.forget(pc)
		}
	}
	cfg.Events.GoAway = func(http2.ErrCode, uint32, []byte) {
		// Streams in flight finish; no new one goes on it.
		if pc := self.Load(); pc != nil {
			u.mu.Lock()
			u.retireLocked(pc)
			u.mu.Unlock()
		}
	}
	cc, err := h2.NewClientConn(c, &cfg)
	if err != nil {
		c.Close()
		return nil, &ConnectError{Cluster: u.wc.Name(), Tried: []string{addr}, Err: err}
	}
	pc.cc = cc
	self.Store(pc)
	return pc, nil
}

// tlsConnOf is the TLS connection under c (a DialEndpoint connection,
// which wraps it), or nil for cleartext.
func tlsConnOf(c net.Conn) *tls.Conn {
	if mc, ok := c.(*multiplexedConn); ok {
		c = mc.Stream
	}
	tc, _ := c.(*tls.Conn)
	return tc
}

// forget takes a connection that ended out of the pool.
func (u *H2Pool) forget(pc *h2PoolConn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.forgetLocked(pc)
}

// forgetLocked takes pc out of the pool for good.
func (u *H2Pool) forgetLocked(pc *h2PoolConn) {
	u.retireLocked(pc)
	delete(u.all, pc.cc)
}

// retireLocked stops pc from taking new streams; CloseIdle and CloseAll
// still see it.
func (u *H2Pool) retireLocked(pc *h2PoolConn) {
	conns := u.connsByEndpoint[pc.endpoint]
	for k, c := range conns {
		if c == pc {
			conns = append(conns[:k], conns[k+1:]...)
			break
		}
	}
	if len(conns) == 0 {
		delete(u.connsByEndpoint, pc.endpoint)
	} else {
		u.connsByEndpoint[pc.endpoint] = conns
	}
}

// Cluster is the worker cluster view the pool dials for.
func (u *H2Pool) Cluster() *WorkerCluster { return u.wc }

// Scheme is the pool's :scheme: "http" (prior knowledge) or "https".
func (u *H2Pool) Scheme() string { return u.scheme }

// CloseIdle closes the connections that carry no stream and have none
// being opened (a drain; a retired view). Opens are counted under u.mu,
// so none can slip in between the look and the close.
func (u *H2Pool) CloseIdle() {
	var idle []*h2.ClientConn
	u.mu.Lock()
	for cc, pc := range u.all {
		if pc.opening == 0 && cc.ActiveStreams() == 0 {
			idle = append(idle, cc)
			u.forgetLocked(pc)
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
	conns := make([]*h2.ClientConn, 0, len(u.all))
	for cc, pc := range u.all {
		conns = append(conns, cc)
		u.forgetLocked(pc)
	}
	u.mu.Unlock()
	for _, cc := range conns {
		cc.Close()
	}
}
