package workers

import (
	"bytes"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/net/http2"
)

// HTTP/2 downstream. Unlike HTTP/1.1 (h1conn.go), HTTP/2 is served by
// golang.org/x/net/http2's server, one ServeConn per client connection: a
// multiplexed protocol with flow control and HPACK is not where a codec of
// our own pays off, and HTTP/2 clients keep few connections open. Its
// requests go through the same routing (routematch.go), stats and upstream
// pools as HTTP/1.1 ones (h2handle.go, h2proxy.go).
//
// A connection gets here two ways: a TLS handshake that negotiated ALPN h2
// (the TLS path calls serveHTTP2), or, on a cleartext listener with
// http2_cleartext = true, a client that opens with the HTTP/2 connection
// preface (prior knowledge, "h2c"; see servedAsHTTP2).

// statRqHTTP2 counts the requests that came over HTTP/2 (also counted in
// downstream_rq_total).
const statRqHTTP2 = "downstream_rq_http2_total"

// http2PrefaceLine is the request line of the HTTP/2 connection preface
// ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"): what the HTTP/1.1 parser sees of it
// before it refuses the version.
const http2PrefaceLine = "PRI * HTTP/2.0\r\n"

// h2State is a Manager's HTTP/2 side, built on first use (most
// generations never see an HTTP/2 client). Its servers are fixed for the
// Manager's life, like the HTTP/1.1 connection settings.
type h2State struct {
	once      sync.Once
	listeners []*h2Listener // by Manager listener index; nil: not http
	// upstreams are the HTTP/2 upstream transports, by worker cluster
	// view (h2upstream.go).
	upstreams sync.Map // *upstream.WorkerCluster → *h2Upstream
	// guards are the connections being served (h2guard.go), for the
	// drain's graceful GOAWAY.
	guards h2Guards
}

// h2Listener is one http listener's HTTP/2 server. base is the
// http.Server the connections are served under (ServeConnOpts.BaseConfig);
// it never listens itself, and the drain does not shut it down: its
// GOAWAY is the connection guard's, per connection (h2guard.go).
type h2Listener struct {
	base *http.Server
	srv  *http2.Server
}

func (m *Manager) http2() *h2State {
	h := &m.h2
	h.once.Do(func() { h.build(m) })
	return h
}

func (h *h2State) build(m *Manager) {
	h.listeners = make([]*h2Listener, len(m.listeners))
	for i, ml := range m.listeners {
		if ml.h1 == nil {
			continue
		}
		p := ml.h2
		base := &http.Server{
			// SETTINGS_MAX_HEADER_LIST_SIZE, and the bound on a
			// request's decoded header block.
			MaxHeaderBytes: p.maxHeaderBytes,
			ConnState:      h2ConnState,
			// x/net logs each client's protocol errors: debug lines
			// of ours, not the standard logger's stderr.
			ErrorLog: m.log.Named("http2").StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug}),
			// WriteTimeout would bound a whole response (per stream),
			// which a long download through the proxy must not be;
			// write_timeout bounds each write instead (below).
		}
		srv := &http2.Server{
			// An idle connection (no stream open) gets a GOAWAY and
			// closes after idle_timeout, as an idle HTTP/1.1 one closes.
			IdleTimeout: p.idleTimeout,
			// 0: x/net's default of 250 concurrent streams per
			// connection.
			MaxConcurrentStreams: 0,
			// A client that stops reading is cut off after
			// write_timeout without progress, as in HTTP/1.1.
			WriteByteTimeout: p.writeTimeout,
		}
		if err := http2.ConfigureServer(base, srv); err != nil {
			// Only a TLSConfig with a cipher list lacking HTTP/2's
			// mandatory suite fails, and base has none.
			panic("workers: http2.ConfigureServer: " + err.Error())
		}
		h.listeners[i] = &h2Listener{base: base, srv: srv}
	}
}

// serveHTTP2 serves cc as HTTP/2 until the connection ends: after a TLS
// handshake that chose ALPN h2 (cc.c is then the TLS connection), or after
// the HTTP/1.1 path saw the connection preface (its bytes, still in
// cc.rbuf[cc.r:cc.w], are read again by the HTTP/2 server first). The
// caller closes cc afterwards (Close is idempotent).
func (m *Manager) serveHTTP2(cc *clientConn) {
	h := m.http2()
	hl := h.listeners[cc.li]
	if hl == nil {
		return // not an http listener: nothing speaks HTTP/2 there
	}
	conn := &h2NetConn{Conn: cc.c, cc: cc, guard: newH2Guard(cc)}
	h.guards.add(conn.guard)
	defer func() {
		h.guards.remove(conn.guard)
		conn.guard.ended()
	}()
	if cc.r < cc.w {
		// A copy: the read buffer goes back to its pool now, not when
		// the connection (which may live for hours) ends.
		conn.guard.setPending(bytes.Clone(cc.rbuf[cc.r:cc.w]))
		cc.r = cc.w
	}
	cc.releaseState()
	// The HTTP/1.1 path's header timeout is no longer the bound: the
	// HTTP/2 server times the preface, idle connections and writes
	// itself.
	cc.c.SetDeadline(time.Time{})
	cc.readDeadline, cc.writeDeadline = time.Time{}, time.Time{}

	var nc net.Conn = conn
	if _, ok := any(cc.c).(connectionStater); ok {
		// The server reads the TLS state (version, cipher suite,
		// r.TLS) through this method; a cleartext connection must not
		// have it, or the server refuses it as TLS too weak.
		nc = &h2TLSConn{conn}
	}
	hl.srv.ServeConn(nc, &http2.ServeConnOpts{
		// Ends at Close or a forced drain: handlers' upstream requests
		// end with it.
		Context:    m.ctx,
		BaseConfig: hl.base,
		Handler:    &h2StreamGuard{next: &h2Handler{cc: cc, rqHTTP2: cc.st.rqHTTP2}, guard: conn.guard, writeTimeout: cc.settings.writeTimeout},
	})
}

// servedAsHTTP2 is the HTTP/1.1 path's hook for a head it refuses: on a
// listener with http2_cleartext, a connection that opened with the HTTP/2
// preface is served as HTTP/2 (and true says it is over). Anywhere else
// the preface keeps its HTTP/1.1 answer (505).
func (cc *clientConn) servedAsHTTP2() bool {
	if !cc.m.listeners[cc.li].http2Cleartext || !bytes.HasPrefix(cc.rbuf[cc.r:cc.w], []byte(http2PrefaceLine)) {
		return false
	}
	cc.m.serveHTTP2(cc)
	return true
}

// goAwayHTTP2 is the drain's hook: every HTTP/2 connection gets the
// graceful GOAWAY (h2guard.go: stream id 2^31-1 and a PING now, the final
// GOAWAY once the PING is answered), finishes the streams it has and is
// closed by the drain once idle (drainIdleGrace). A connection that
// starts later gets it as soon as it is served (goAwayIfDraining).
func (m *Manager) goAwayHTTP2() {
	h := &m.h2
	// Nothing to do if no HTTP/2 connection was ever served; once
	// also keeps a server built now from missing the drain.
	built := true
	h.once.Do(func() { built = false; h.build(m) })
	if !built {
		return
	}
	for _, g := range h.guards.all() {
		g.drainGoAway()
	}
	h.upstreams.Range(func(_, v any) bool {
		if u := v.(*h2Upstream); u != nil {
			u.pool.CloseIdle()
		}
		return true
	})
}

// goAwayIfDraining sends the graceful GOAWAY to an HTTP/2 connection the
// drain's missed: one that became HTTP/2 after the drain began (accepted
// before, its TLS handshake or its h2c preface done after). Otherwise a
// client that opened it and has sent nothing yet would see it closed
// under it, without notice, once idle for drainIdleGrace.
//
// Called once the connection is in h.guards: then either draining is
// already true here, or it was set after, and the drain's own pass over
// the guards (which follows that store) reaches it. A guard sends its
// GOAWAY once however often asked.
func (m *Manager) goAwayIfDraining(g *h2Guard) {
	if m.draining.Load() {
		g.drainGoAway()
	}
}

type connectionStater interface {
	ConnectionState() tls.ConnectionState
}

// h2NetConn is the client connection as the HTTP/2 server sees it: the
// bytes the HTTP/1.1 path had already read come first; what goes through
// is counted in the listener's byte counters; Close is the clientConn's
// (which takes it out of the worker's connection set and counts it).
type h2NetConn struct {
	net.Conn
	cc    *clientConn
	guard *h2Guard // reads and writes go through it (h2guard.go)
	// served: the HTTP/2 server has taken the connection in (its first
	// ConnState call). Touched by the server's goroutine for it only.
	served bool
}

func (c *h2NetConn) Read(p []byte) (int, error) { return c.guard.read(p) }

func (c *h2NetConn) Write(p []byte) (int, error) {
	n, err := c.guard.write(p)
	if n > 0 {
		c.cc.st.txBytes.Add(uint64(n))
	}
	return n, err
}

func (c *h2NetConn) Close() error { return c.cc.Close() }

// h2TLSConn is an h2NetConn over TLS.
type h2TLSConn struct{ *h2NetConn }

func (c *h2TLSConn) ConnectionState() tls.ConnectionState {
	return any(c.cc.c).(connectionStater).ConnectionState()
}

// h2ConnState keeps the connection's idle mark for the drain: an HTTP/2
// connection without an open stream is idle, like a keep-alive HTTP/1.1
// connection between requests.
func h2ConnState(c net.Conn, s http.ConnState) {
	var hc *h2NetConn
	switch c := c.(type) {
	case *h2NetConn:
		hc = c
	case *h2TLSConn:
		hc = c.h2NetConn
	default:
		return
	}
	if !hc.served {
		hc.served = true
		hc.cc.m.goAwayIfDraining(hc.guard)
	}
	switch s {
	case http.StateIdle:
		hc.cc.idleSince.Store(max(monotime(), 1))
	case http.StateActive:
		hc.cc.idleSince.Store(0)
	}
}
