package httpfront

import (
	"bytes"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotproxy/hotproxy/h2"
)

// HTTP/2 downstream, on our own engine (h2's ServerConn; the
// stream front end is h2front.go). A connection gets here two ways: a TLS
// handshake that negotiated ALPN h2 (the TLS path calls serveHTTP2), or,
// on a cleartext listener with http2_cleartext = true, a client that opens
// with the HTTP/2 connection preface (prior knowledge, "h2c"; see
// servedAsHTTP2). Its requests go through the same routing
// (the route package), stats and upstream pools as HTTP/1.1 ones.

// StatRqHTTP2 counts the requests that came over HTTP/2 (also counted in
// downstream_rq_total).
const StatRqHTTP2 = "downstream_rq_http2_total"

// http2PrefaceLine is the request line of the HTTP/2 connection preface
// ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"): what the HTTP/1.1 parser sees of it
// before it refuses the version.
const http2PrefaceLine = "PRI * HTTP/2.0\r\n"

// h2State is a Manager's HTTP/2 side (Env.h2).
type h2State struct {
	// served: an HTTP/2 client connection was served (most generations
	// never see one); until then the drain has nothing to do here.
	served atomic.Bool
	// upstreams are the HTTP/2 upstream transports, by worker cluster
	// view (h2upstream.go).
	upstreams sync.Map // *upstream.WorkerCluster → *h2Upstream
	// fronts are the connections being served, for the drain's GOAWAY.
	fronts h2Fronts
}

// serveHTTP2 serves cc as HTTP/2 until the connection ends: after a TLS
// handshake that chose ALPN h2 (cc.c is then the TLS connection), or after
// the HTTP/1.1 path saw the connection preface (its bytes, still in
// cc.rbuf[cc.r:cc.w], are read again by the engine first). The caller
// closes cc afterwards (Close is idempotent).
func serveHTTP2(cc *Conn) {
	h := &cc.l.Env.h2
	base := cc.l.H2
	if base == nil {
		return // not an http listener: nothing speaks HTTP/2 there
	}
	h.served.Store(true)
	var preread []byte
	if cc.r < cc.w {
		// A copy: the read buffer goes back to its pool now, not when
		// the connection (which may live for hours) ends.
		preread = bytes.Clone(cc.rbuf[cc.r:cc.w])
		cc.r = cc.w
	}
	cc.releaseState()
	// The HTTP/1.1 path's header timeout is no longer the bound: the
	// engine times idle connections and writes itself.
	cc.c.SetDeadline(time.Time{})
	cc.readDeadline, cc.writeDeadline = time.Time{}, time.Time{}

	cfg := *base
	calm := cc.st.H2Calm
	cfg.Events.FloodDetected = func(kind string) {
		if kind != "header-block" { // that one is a PROTOCOL_ERROR
			calm.Inc()
		}
	}
	f := &h2Front{cc: cc}
	f.sc = h2.NewServerConn(&h2Conn{Conn: cc.c, cc: cc}, preread, &cfg, f)
	cc.idleSince.Store(max(Monotime(), 1)) // no stream yet
	h.fronts.add(f)
	defer h.fronts.remove(f)
	f.goAwayIfDraining()
	f.sc.Serve()
}

// servedAsHTTP2 is the HTTP/1.1 path's hook for a head it refuses: on a
// listener with http2_cleartext, a connection that opened with the HTTP/2
// preface is served as HTTP/2, and one whose head does not even name an
// HTTP version is taken for an HTTP/2 client with a broken preface
// and closed without an answer (RFC 9113 §3.4: a connection error; an
// HTTP/1.1 400 would read as garbage frames to it). true says the
// connection is over. Anywhere else the refusal keeps its HTTP/1.1
// answer (400, 505).
func (cc *Conn) servedAsHTTP2() bool {
	if !cc.l.HTTP2Cleartext {
		return false
	}
	head := cc.rbuf[cc.r:cc.w]
	if bytes.HasPrefix(head, []byte(http2PrefaceLine)) {
		serveHTTP2(cc)
		return true
	}
	// No "HTTP/" anywhere in the head: no HTTP/1.x request, however
	// malformed (a bare LF in the target still names its version).
	return !bytes.Contains(head, []byte("HTTP/"))
}

// GoAwayHTTP2 is the drain's hook: every HTTP/2 connection gets the
// engine's graceful GOAWAY (stream id 2^31-1 and a PING now, the final
// GOAWAY naming the last stream once the PING is answered), finishes the streams it has and is
// closed by the drain once idle (drainIdleGrace). A connection that
// starts later gets it as soon as it is served (goAwayIfDraining).
func (e *Env) GoAwayHTTP2() {
	h := &e.h2
	if !h.served.Load() {
		return
	}
	for _, f := range h.fronts.all() {
		f.sc.Shutdown()
	}
	h.upstreams.Range(func(_, v any) bool {
		if u := v.(*h2Upstream); u != nil {
			u.pool.CloseIdle()
		}
		return true
	})
}

// GoAwayHTTP2Of is GoAwayHTTP2 for the connections of one listener, the
// one whose Listener.Draining is draining (set before the call): a
// listener removed or changed in process drains alone, and the HTTP/2
// upstream pools, which every listener shares, stay as they are.
func (e *Env) GoAwayHTTP2Of(draining *atomic.Bool) {
	h := &e.h2
	if !h.served.Load() {
		return
	}
	for _, f := range h.fronts.all() {
		if f.cc.l.Draining == draining {
			f.sc.Shutdown()
		}
	}
}

// goAwayIfDraining sends the graceful GOAWAY to an HTTP/2 connection the
// drain's missed: one that became HTTP/2 after the drain began (accepted
// before, its TLS handshake or its h2c preface done after). Otherwise a
// client that opened it and has sent nothing yet would see it closed
// under it, without notice, once idle for drainIdleGrace.
//
// Called once the connection is in h.fronts: then either draining is
// already true here, or it was set after, and the drain's own pass over
// the fronts (which follows that store) reaches it. The engine sends its
// GOAWAY once however often asked.
func (f *h2Front) goAwayIfDraining() {
	if f.cc.l.Draining.Load() {
		f.sc.Shutdown()
	}
}
