package workers

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/internal/accesslog"
	"github.com/hotproxy/hotproxy/stats"
	"github.com/hotproxy/hotproxy/workers/http1"
)

// h2Handler serves the requests of one HTTP/2 connection, each stream on
// a goroutine of the HTTP/2 server's: it may run many times at once, so
// it touches none of the clientConn's per-request fields (those belong to
// the HTTP/1.1 path's single goroutine), only what is safe to share: the
// stats lanes (atomic), the worker's view (an atomic pointer), the
// upstream pools (locked).
type h2Handler struct {
	cc      *clientConn
	rqHTTP2 stats.CounterLane
}

var _ http.Handler = (*h2Handler)(nil)

// h2Request is one stream's state, pooled: the cleaned path and the
// upstream request head are built in its buffers.
type h2Request struct {
	path []byte
	head []byte
	fwd  exchange.ForwardedFields // the upstream head's fields
	xchg h2Exchange               // a request to an HTTP/1.1 cluster
}

var h2Requests = sync.Pool{New: func() any {
	return &h2Request{path: make([]byte, 0, 256), head: make([]byte, 0, 4<<10)}
}}

// h2Result is what a request's handling leaves for its stats and access
// log.
type h2Result struct {
	status  int // the status sent; 0: none (the stream was reset)
	upAddr  string
	retries int
	sent    int64 // body bytes sent, for the access log
}

func (h *h2Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cc := h.cc
	start := time.Now()
	st := cc.st
	st.rqTotal.Inc()
	h.rqHTTP2.Inc()
	st.rqActive.Inc()
	hr := h2Requests.Get().(*h2Request)
	var res h2Result
	var rt *route
	defer func() {
		st.requestDone(start)
		st.rqActive.Dec()
		if cc.logs != nil {
			h.log(r, rt, &res, start)
		}
		hr.head = hr.head[:0]
		h2Requests.Put(hr)
	}()
	// No "Connection: close" during a drain (x/net would answer it with
	// a GOAWAY of its own at once): every connection gets the drain's
	// graceful GOAWAY (h2guard.go), late ones included.
	if h.overloaded(w, &res) { // overload.go: 503, GOAWAY
		return
	}

	// One load: the listener and the snapshot of its clusters must be
	// of the same publication.
	view := cc.wk.view.Load()
	lv := view.listeners[cc.li]
	if r.Method == http.MethodConnect {
		res.status = h2Answer(w, st, http.StatusMethodNotAllowed, "CONNECT is not supported over HTTP/2 (use HTTP/1.1)")
		return
	}
	if err := checkH2Request(r, cc.settings.limits); err != nil {
		res.status = h2Answer(w, st, err.Status, err.Reason)
		res.sent = int64(len(err.Reason) + 1)
		return
	}
	if lv != nil {
		hr.path = http1.CleanPath(hr.path[:0], []byte(r.RequestURI))
		rt = lv.match(r.Host, bytesString(hr.path), cc.sni)
	}
	switch {
	case rt == nil:
		res.status = h2Answer(w, st, http.StatusNotFound, noRouteBody)
		res.sent = int64(len(noRouteBody) + 1)
	case rt.direct != nil:
		res.status = h2Direct(w, r, st, rt.direct)
		if r.Method != http.MethodHead {
			res.sent = int64(len(rt.direct.body))
		}
	default:
		wc := lv.clusters[rt.index]
		if rt.http2 {
			h.proxyHTTP2(w, r, lv, rt, cc.m.http2UpstreamOf(view.snap, wc), hr, start, &res)
		} else {
			h.proxyHTTP1(w, r, lv, rt, wc, hr, start, &res)
		}
	}
}

// checkH2Request holds an HTTP/2 request's :method, :path and :authority
// (or Host) to the rules of the HTTP/1.1 parser (http1.CheckRequestParts),
// so that a request gets the same answer, 400, whichever protocol carried
// it, and nothing reaches an HTTP/1.1 upstream's request line that would
// change its words. x/net's server has already reset the stream
// (PROTOCOL_ERROR, before any handler) for what RFC 9113 calls malformed:
// a control byte (CR, LF, NUL, DEL) in any field, an upper-case or
// non-token field name, a missing :method or :path, a :path that starts
// with neither '/' nor is "*" or that url.ParseRequestURI refuses (HTAB,
// a bad percent-encoding in the path), a :scheme other than http and https,
// userinfo in :authority, a Host that differs from :authority, several
// Host fields, and connection-specific fields (a 400 of its own). What it
// lets through and is refused here: a space, '\', '#' or non-ASCII byte in
// :path, "*" for a method other
// than OPTIONS, a method that is not a token ("GET /x HTTP/1.1"), an
// :authority that is not host[:port] ("a,b", "secret.test;x",
// "secret.test.."), a request with neither :authority nor Host, and a
// :method and :path longer than the HTTP/1.1 request line may be (414).
// CONNECT is refused before this.
func checkH2Request(r *http.Request, lim http1.Limits) *http1.Error {
	err := http1.CheckRequestParts(stringBytes(r.Method), stringBytes(r.RequestURI), stringBytes(r.Host), lim)
	if err == nil {
		return nil
	}
	return err.(*http1.Error)
}

// h2Answer sends one of the proxy's own plain-text responses.
func h2Answer(w http.ResponseWriter, st *listenerStats, status int, body string) int {
	hd := w.Header()
	hd["Content-Type"] = plainText
	hd["X-Content-Type-Options"] = nosniff
	hd["Content-Length"] = []string{strconv.Itoa(len(body) + 1)}
	st.status(status)
	w.WriteHeader(status)
	w.Write([]byte(body + "\n"))
	return status
}

var (
	plainText = []string{"text/plain; charset=utf-8"}
	nosniff   = []string{"nosniff"}
)

func h2Direct(w http.ResponseWriter, r *http.Request, st *listenerStats, d *directResponse) int {
	hd := w.Header()
	hd["Content-Type"] = d.contentType
	if d.contentLength != nil {
		hd["Content-Length"] = d.contentLength
	}
	st.status(d.status)
	w.WriteHeader(d.status)
	if r.Method != http.MethodHead && len(d.body) > 0 {
		w.Write(d.body)
	}
	return d.status
}

// log queues the request's access-log line. The connection's record is
// the HTTP/1.1 path's; a stream fills one of its own.
func (h *h2Handler) log(r *http.Request, rt *route, res *h2Result, start time.Time) {
	cc := h.cc
	rec := accessRecords.Get().(*accessRecord)
	defer accessRecords.Put(rec)
	fillH2Record(&rec.r, r, cc.clientIP, start)
	rec.r.Duration = time.Since(start)
	rec.r.Status = uint16(res.status)
	rec.r.Retries = uint8(min(res.retries, 255))
	rec.r.Upstream = res.upAddr
	if rt != nil {
		rec.r.Cluster = rt.cluster
	}
	rec.r.BytesSent = res.sent
	for _, l := range cc.logs {
		if !l.Enqueue(&rec.r) {
			cc.st.logDropped.Inc()
		}
	}
}

// accessRecords are the streams' access-log records (a record is a few
// hundred bytes: pooled rather than allocated per request).
var accessRecords = sync.Pool{New: func() any { return new(accessRecord) }}

type accessRecord struct{ r accesslog.Record }

func fillH2Record(rec *accesslog.Record, r *http.Request, clientIP []byte, start time.Time) {
	*rec = accesslog.Record{Start: start, HTTP2: true}
	rec.SetMethod([]byte(r.Method))
	rec.SetPath([]byte(r.RequestURI))
	rec.SetClientIP(clientIP)
	rec.BytesReceived = r.ContentLength
}
