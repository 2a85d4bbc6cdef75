package workers

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/stats"
)

// TLS termination: an http or tcp listener with [listeners.tls] wraps each
// accepted socket in a tls.Server with the config the caller built for it
// (Options.ServerTLS: certificates, rotation and session tickets are
// package tlsconf's). The handshake runs on the connection's own goroutine,
// bounded by handshake_timeout, before anything else is read.

// listenerTLS is a terminating listener's TLS, fixed when the listener is
// built (like its sockets).
type listenerTLS struct {
	// config is what the listener's connections are wrapped with: its
	// GetConfigForClient hands every handshake current, the config the
	// caller built (never a clone: it must see rotated session-ticket
	// keys). An UpdateListeners that leaves the listener unchanged swaps
	// current for the same listener's config of the caller's newer
	// tlsconf.Set (same certificates, the ticket keys handed over), so
	// that every handshake uses the set the server rotates and reloads,
	// without touching the listener's sockets or connections. One atomic
	// load per handshake.
	config           *tls.Config
	current          atomic.Pointer[tls.Config]
	handshakeTimeout time.Duration
}

// configForClient is config's GetConfigForClient.
func (lt *listenerTLS) configForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	return lt.current.Load(), nil
}

// newListenerTLS checks that the caller built a TLS config for every
// listener that terminates TLS, before any socket is touched.
func newListenerTLS(ls *listenerSnap, built map[string]*tls.Config) (*listenerTLS, error) {
	if ls.tlsHandshakeTimeout == 0 {
		return nil, nil
	}
	cfg := built[ls.name]
	if cfg == nil {
		return nil, fmt.Errorf("listener %q: [listeners.tls] is set but no TLS server config was built for it (workers.Options.ServerTLS has no entry %q; the server builds one per TLS listener with package tlsconf)", ls.name, ls.name)
	}
	lt := &listenerTLS{handshakeTimeout: ls.tlsHandshakeTimeout}
	lt.current.Store(cfg)
	lt.config = &tls.Config{GetConfigForClient: lt.configForClient}
	return lt, nil
}

// TLS stat names, in the listener's scope (listener.<name>.): per-connection
// counts of the handshakes this worker ran. The certificate-choice, expiry
// and rotation stats (ssl.no_certificate, ssl.certificate.*,
// ssl.session_ticket_key_rotation) are package tlsconf's.
const (
	statSSLHandshake       = "ssl.handshake"        // counter: handshakes completed
	statSSLSessionReused   = "ssl.session_reused"   // counter: of which resumed a session (ticket)
	statSSLConnectionError = "ssl.connection_error" // counter: handshakes failed or timed out (the connection is closed)
	statSSLVersionTLS12    = "ssl.version.tls1_2"   // counter: handshakes completed with TLS 1.2
	statSSLVersionTLS13    = "ssl.version.tls1_3"   // counter: ... with TLS 1.3
	statSSLALPNH2          = "ssl.alpn.h2"          // counter: handshakes that negotiated h2
	statSSLALPNHTTP11      = "ssl.alpn.http_1_1"    // counter: ... http/1.1
)

// tlsStats are one worker's handles on a terminating listener's TLS stats.
type tlsStats struct {
	handshake, sessionReused, connectionError stats.CounterLane
	tls12, tls13                              stats.CounterLane
	alpnH2, alpnHTTP11                        stats.CounterLane
}

func newTLSStats(st *stats.Store, listener string, worker int) *tlsStats {
	lane := worker + 1
	p := "listener." + listener + "."
	c := func(name string) stats.CounterLane { return st.Counter(p + name).Lane(lane) }
	return &tlsStats{
		handshake:       c(statSSLHandshake),
		sessionReused:   c(statSSLSessionReused),
		connectionError: c(statSSLConnectionError),
		tls12:           c(statSSLVersionTLS12),
		tls13:           c(statSSLVersionTLS13),
		alpnH2:          c(statSSLALPNH2),
		alpnHTTP11:      c(statSSLALPNHTTP11),
	}
}

// completed counts a finished handshake.
func (ts *tlsStats) completed(cs *tls.ConnectionState) {
	ts.handshake.Inc()
	if cs.DidResume {
		ts.sessionReused.Inc()
	}
	switch cs.Version {
	case tls.VersionTLS12:
		ts.tls12.Inc()
	case tls.VersionTLS13:
		ts.tls13.Inc()
	}
	switch cs.NegotiatedProtocol {
	case config.ALPNHTTP2:
		ts.alpnH2.Inc()
	case config.ALPNHTTP11:
		ts.alpnHTTP11.Inc()
	}
}

// handshake runs tc's server handshake within the listener's
// handshake_timeout (on sock, the socket under tc) and counts its outcome.
// The deadlines are cleared afterwards.
func (lt *listenerTLS) handshake(tc *tls.Conn, sock net.Conn, ts *tlsStats) (tls.ConnectionState, error) {
	sock.SetDeadline(time.Now().Add(lt.handshakeTimeout))
	if err := tc.Handshake(); err != nil {
		ts.connectionError.Inc()
		return tls.ConnectionState{}, err
	}
	sock.SetDeadline(time.Time{})
	cs := tc.ConnectionState()
	ts.completed(&cs)
	return cs, nil
}

// answerPlainHTTP tells a client that spoke plain HTTP to a TLS listener
// what it did, as net/http does, in plain text (it reads no TLS). err is
// the failed handshake's.
func answerPlainHTTP(err error) {
	var rhe tls.RecordHeaderError
	if !errors.As(err, &rhe) || rhe.Conn == nil || !looksLikeHTTP(rhe.RecordHeader[:]) {
		return
	}
	rhe.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	io.WriteString(rhe.Conn, "HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
}

func looksLikeHTTP(hdr []byte) bool {
	switch string(hdr) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO", "DELET", "PATCH", "CONNE":
		return true
	}
	return false
}
