package workers

import (
	"crypto/tls"
	"net"

	httpfront "github.com/hotproxy/hotproxy/downstream/http"
	"github.com/hotproxy/hotproxy/internal/rawsock"
)

// An http listener's connections are served by the HTTP front end
// (downstream/http), as a tcp listener's are by downstream/tcp (tcp.go):
// the worker accepts, admits and keeps each connection in its set; the
// front end serves it. What the front end asks of the worker goes through
// httpHost, one per worker and http listener, built with the Manager.

// httpHost is the worker's side of one http listener's connections on one
// worker (httpfront.Host).
type httpHost struct {
	m     *Manager
	wk    *worker
	ml    *mlistener
	li    int // ml.idx
	st    *listenerStats
	slots *connSlots
}

var _ httpfront.Host = (*httpHost)(nil)

// View is the listener's view in the worker's current snapshot, or nil
// when the snapshot has no such listener.
func (h *httpHost) View() *httpfront.View {
	if lv := h.wk.view.Load().listener(h.li); lv != nil {
		return lv.http
	}
	return nil
}

// Handshake runs the listener's TLS handshake (tls.go); a client that
// spoke plain HTTP to it is told so.
func (h *httpHost) Handshake(tc *tls.Conn, sock net.Conn) (tls.ConnectionState, error) {
	cs, err := h.ml.tls.handshake(tc, sock, h.st.tls)
	if err != nil {
		answerPlainHTTP(err)
	}
	return cs, err
}

// Closed gives back what accept took for c: its place in the connection
// set, its connection slot (connlimit.go), the connection gauges.
func (h *httpHost) Closed(c *httpfront.Conn) {
	h.st.closed()
	h.wk.conns.remove(c)
	h.slots.release()
}

// RequestRefused counts a request refused by refuse_requests.
func (h *httpHost) RequestRefused() {
	oc := h.m.overloadStatsOf()
	oc.refused.Lane(h.wk.id + 1).Inc()
	oc.shed.Lane(h.wk.id + 1).Inc()
}

// newClientConn is the front end's connection for c, accepted by a.
func (m *Manager) newClientConn(a *acceptor, c *rawsock.Conn) *httpfront.Conn {
	return httpfront.NewConn(a.lw.http, c)
}

// newHTTPListener builds worker wk's front-end listener of ml (nil for a
// tcp listener), once, with the listener.
func (m *Manager) newHTTPListener(wk *worker, ml *mlistener, st *listenerStats) *httpfront.Listener {
	if ml.h1 == nil {
		return nil
	}
	h2cfg := httpfront.H2ServerConfig(ml.h2)
	l := &httpfront.Listener{
		Env: &m.http, Worker: &wk.front, Name: ml.name, Index: ml.idx,
		Draining: &ml.draining, ConnWG: &ml.httpWG,
		Stats: &st.Stats, Settings: ml.h1, H2: &h2cfg, HTTP2Cleartext: ml.http2Cleartext,
		AccessLogs: ml.accessLogs,
		Host:       &httpHost{m: m, wk: wk, ml: ml, li: ml.idx, st: st, slots: ml.slots},
	}
	if ml.tls != nil {
		l.TLS = ml.tls.config
	}
	return l
}
