package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/stats"
)

// ErrTLSHandshake: a TLS cluster's endpoint accepted the TCP connection
// but the handshake failed (its certificate did not verify, it wanted a
// client certificate, no common version, a timeout). It is a connect
// failure: the next endpoint is tried, outlier detection counts it, and
// the error a request gets is a ConnectError wrapping it.
var ErrTLSHandshake = errors.New("upstream TLS handshake failed")

// sessionCacheSize is the capacity of each endpoint's TLS session cache.
// crypto/tls keys the cache by server name and keeps one session per key,
// and every endpoint has a cache of its own (see clientTLSConfigs), so a
// handful is plenty.
const sessionCacheSize = 4

// NewClientTLS builds the client TLS configuration of a cluster from its
// [clusters.tls] table: the CA bundle (nil: the system's pool), the
// client certificate, the minimum version, insecure_skip_verify, and
// server_name when set. The result has no session cache and no ALPN; the
// caller sets them, and ServerName when server_name is empty (the
// endpoint's host: a name, or an IP address that crypto/tls verifies
// against the certificate's IP SANs and does not send as SNI).
//
// Errors name the file; the caller adds the cluster.
func NewClientTLS(t *config.ClusterTLS) (*tls.Config, error) {
	cfg := &tls.Config{
		ServerName:         t.ServerName,
		MinVersion:         config.TLSVersion(t.MinVersion), // 0 (a literal spec): crypto/tls's own, 1.2
		InsecureSkipVerify: t.InsecureSkipVerify,
	}
	if t.CA != "" {
		pool, err := config.LoadCAPool(t.CA)
		if err != nil {
			return nil, fmt.Errorf("tls.ca: %w (want a PEM bundle of the authorities the endpoints' certificates chain to)", err)
		}
		cfg.RootCAs = pool
	}
	if t.Cert != "" || t.Key != "" {
		pair, err := config.LoadCertificatePair(config.CertificatePair{Cert: t.Cert, Key: t.Key})
		if err != nil {
			return nil, fmt.Errorf("tls.cert/tls.key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{*pair}
	}
	return cfg, nil
}

// clientTLSConfigs builds the TLS configuration of each endpoint of a
// cluster (nil when the cluster has no [clusters.tls]), once, when the
// cluster is built: a dial only reads it. endpoints are the endpoints as
// the config names them ("host:port").
//
// Each endpoint gets its own session cache: crypto/tls keys the cache by
// server name, and endpoints sharing a server_name would otherwise offer
// each other's tickets, which only the endpoint that issued one can take
// (unless they share ticket keys), and resume nothing.
func clientTLSConfigs(spec config.Cluster) ([]*tls.Config, error) {
	if spec.TLS == nil {
		return nil, nil
	}
	base, err := NewClientTLS(spec.TLS)
	if err != nil {
		return nil, fmt.Errorf("cluster %q: %w", spec.Name, err)
	}
	if spec.HTTP2 {
		base.NextProtos = []string{config.ALPNHTTP2}
	}
	// An HTTP/1.1 cluster offers no ALPN: the same cluster may carry a
	// tcp listener's stream, which is no HTTP at all, and a server takes
	// a ClientHello without ALPN as HTTP/1.1.
	out := make([]*tls.Config, len(spec.Endpoints))
	for i, ep := range spec.Endpoints {
		cfg := base.Clone()
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(ep)
			if err != nil {
				return nil, fmt.Errorf("cluster %q: endpoint %q: %w", spec.Name, ep, err)
			}
			cfg.ServerName = host
		}
		cfg.ClientSessionCache = tls.NewLRUClientSessionCache(sessionCacheSize)
		out[i] = cfg
	}
	return out, nil
}

// ClientTLS returns the TLS configuration connections to endpoint i use
// (its index in Endpoints), or nil for a cluster without TLS. It is
// shared: Clone it before changing anything. For a cluster with http2 it
// offers ALPN "h2".
func (c *Cluster) ClientTLS(i int) *tls.Config {
	if c.tls == nil {
		return nil
	}
	return c.tls[i]
}

// ClientTLS is Cluster.ClientTLS for a worker's view.
func (wc *WorkerCluster) ClientTLS(i int) *tls.Config {
	if wc.tls == nil {
		return nil
	}
	return wc.tls[i]
}

// sslStats are a TLS cluster's handles (cluster.<name>.ssl.*), on the
// lane of the Stats that hold them.
type sslStats struct {
	handshake       stats.CounterLane
	sessionReused   stats.CounterLane
	connectionError stats.CounterLane
}

func newSSLStats(st *stats.Store, cluster string, lane int) *sslStats {
	sc := "cluster." + cluster + ".ssl."
	return &sslStats{
		handshake:       st.Counter(sc + "handshake").Lane(lane),
		sessionReused:   st.Counter(sc + "session_reused").Lane(lane),
		connectionError: st.Counter(sc + "connection_error").Lane(lane),
	}
}

// handshake makes tc, a new connection to endpoint i, a TLS connection:
// the handshake must end by deadline (the connect timeout's, which the
// TCP connect already ran against; zero: none) and is abandoned when ctx
// ends. On error tc is closed. st, when not nil, counts the outcome.
func (wc *WorkerCluster) handshake(ctx context.Context, tc *net.TCPConn, raw syscall.RawConn, i int, deadline time.Time, st *Stats) (*tls.Conn, *tlsTransport, error) {
	tr := newTLSTransport(tc, raw)
	conn := tls.Client(tr, wc.tls[i])
	if !deadline.IsZero() {
		tc.SetDeadline(deadline)
	}
	err := conn.HandshakeContext(ctx)
	if err == nil {
		err = tc.SetDeadline(time.Time{})
	}
	var ssl *sslStats
	if st != nil {
		ssl = st.ssl
	}
	if err != nil {
		tc.Close()
		if ssl != nil && ctx.Err() == nil {
			ssl.connectionError.Inc()
		}
		return nil, nil, fmt.Errorf("%w: %w", ErrTLSHandshake, err)
	}
	if ssl != nil {
		ssl.handshake.Inc()
		if conn.ConnectionState().DidResume {
			ssl.sessionReused.Inc()
		}
	}
	return conn, tr, nil
}

// connectDeadline is when a connect that starts now must be done, TLS
// handshake included (zero: no connect timeout).
func (wc *WorkerCluster) connectDeadline() time.Time {
	if wc.timeout <= 0 {
		return time.Time{}
	}
	return time.Now().Add(wc.timeout)
}

// tlsTransport is the socket under a pooled TLS connection. Its Read is
// the socket's, except during the staleness check, when it must not wait.
//
// Why the check cannot just peek at the socket, as it does for plaintext:
// a TLS 1.3 server sends NewSessionTicket messages after the handshake
// (and may send more, or a KeyUpdate, at any time); they wait on the
// socket until the client's next Read, and a peek would take them for a
// response nobody asked for, so every pooled connection would be thrown
// away. And crypto/tls may hold bytes it already read from the socket,
// which a peek cannot see. So the check is a TLS Read that does not wait:
// crypto/tls handles the handshake messages it finds and says what is
// left: application data or a close_notify (the connection is done),
// or nothing yet (it is fine).
type tlsTransport struct {
	*net.TCPConn
	raw syscall.RawConn
	// noWait makes Read a single non-blocking read(2): set only while
	// the pool's check runs, on a connection nobody else is using.
	noWait bool
	// readNow's arguments and results, so that the closure given to
	// RawConn.Control is made once per connection, not per check.
	buf    []byte
	n      int
	err    error
	readFn func(fd uintptr)
}

func newTLSTransport(tc *net.TCPConn, raw syscall.RawConn) *tlsTransport {
	t := &tlsTransport{TCPConn: tc, raw: raw}
	t.readFn = func(fd uintptr) { t.n, t.err = readNoWait(fd, t.buf) }
	return t
}

func (t *tlsTransport) Read(p []byte) (int, error) {
	if !t.noWait {
		return t.TCPConn.Read(p)
	}
	// Control, not RawConn.Read: Read refuses at once when the
	// connection's read deadline has passed, and a pooled connection
	// keeps the deadline of its last exchange.
	t.buf = p
	if err := t.raw.Control(t.readFn); err != nil {
		t.buf = nil
		return 0, err
	}
	t.buf = nil
	return t.n, t.err
}

// errWouldBlock is the non-blocking Read's "nothing to read now". It is a
// temporary net.Error, so crypto/tls keeps the connection usable after it
// (a permanent read error would break it for good).
var errWouldBlock error = wouldBlockError{}

type wouldBlockError struct{}

func (wouldBlockError) Error() string   { return "upstream: nothing to read without waiting" }
func (wouldBlockError) Timeout() bool   { return true }
func (wouldBlockError) Temporary() bool { return true }

// tlsClosedByPeer is closedByPeer for a TLS connection: a TLS Read that
// does not wait.
func (c *Conn) tlsClosedByPeer() bool {
	c.transport.noWait = true
	n, err := c.tls.Read(c.probe[:])
	c.transport.noWait = false
	return n > 0 || !errors.Is(err, errWouldBlock)
}
