package httpfront

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/h2"
	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/internal/accesslog"
	"github.com/hotproxy/hotproxy/route"
	"github.com/hotproxy/hotproxy/upstream"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The HTTP/2 front end: each client connection that speaks HTTP/2 is
// served by our own engine (h2's ServerConn: the frame loop, flow
// control, the flood limits, the graceful GOAWAY), and each of its
// request streams is handed to h2Front.ServeH2, which routes it and
// answers it the way the HTTP/1.1 connection loop answers a request:
// direct responses, 404 without a route, 405 for CONNECT, the overload
// refusal, and proxying through the exchange core to an HTTP/1.1 cluster
// (h2front_h1.go) or an HTTP/2 one (h2front_h2.go). No net/http type is
// on this path.

// StatH2Calm counts the HTTP/2 connections cut with a GOAWAY
// ENHANCE_YOUR_CALM (a flood of resets, of frames that carry no request,
// of empty frames, of unread control replies).
const StatH2Calm = "downstream_cx_http2_calm_total"

// h2Front is one client connection's HTTP/2 front end.
type h2Front struct {
	cc *Conn
	sc *h2.ServerConn
	// active is how many of its streams' handlers run: the connection is
	// idle for the drain (cc.idleSince) when none does.
	active atomic.Int32
	// served: the engine runs; the drain's GOAWAY may be sent.
	served atomic.Bool
}

var _ h2.Handler = (*h2Front)(nil)

// h2Conn is the client connection as the engine sees it: what goes
// through is counted in the listener's byte counters, and Close is the
// Conn's (which takes it out of the worker's connection set and
// counts it).
type h2Conn struct {
	net.Conn
	cc *Conn
}

func (c *h2Conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.cc.st.RxBytes.Add(uint64(n))
	}
	return n, err
}

func (c *h2Conn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.cc.st.TxBytes.Add(uint64(n))
	}
	return n, err
}

func (c *h2Conn) Close() error { return c.cc.Close() }

// h2Fronts are the connections being served, for the drain's GOAWAY.
type h2Fronts struct {
	mu sync.Mutex // guards m
	m  map[*h2Front]struct{}
}

func (s *h2Fronts) add(f *h2Front) {
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[*h2Front]struct{})
	}
	s.m[f] = struct{}{}
	s.mu.Unlock()
}

func (s *h2Fronts) remove(f *h2Front) {
	s.mu.Lock()
	delete(s.m, f)
	s.mu.Unlock()
}

func (s *h2Fronts) all() []*h2Front {
	s.mu.Lock()
	defer s.mu.Unlock()
	fs := make([]*h2Front, 0, len(s.m))
	for f := range s.m {
		fs = append(fs, f)
	}
	return fs
}

// h2StreamState is one stream's pooled state: the cleaned path, the
// upstream request head, the response's header fields and the bytes
// their lowercased names and numbers are written in, and the exchange
// with an HTTP/1.1 cluster.
type h2StreamState struct {
	path    []byte
	head    []byte
	fwd     exchange.ForwardedFields
	fields  []hpack.HeaderField
	scratch []byte
	pumpBuf []byte // the streamed body's trailers (its pump's own)
	xchg    h2StreamExchange
	// An HTTP/2 upstream's exchange (h2front_h2.go).
	up    exchange.H2Transport
	tries exchange.Tries
	body  h2StreamBody
	watch h2ResetWatch
	rec   accesslog.Record
}

var h2StreamStates = sync.Pool{New: func() any {
	return &h2StreamState{
		path: make([]byte, 0, 256), head: make([]byte, 0, 4<<10),
		fields: make([]hpack.HeaderField, 0, 32), scratch: make([]byte, 0, 2<<10),
	}
}}

// ServeH2 serves one request stream, on a goroutine of the engine's.
// It may run many times at once, so it touches none of the Conn's
// per-request fields (those belong to the HTTP/1.1 path's goroutine),
// only what is safe to share: the stats lanes (atomic), the worker's view
// (an atomic pointer), the upstream pools (locked).
func (f *h2Front) ServeH2(st *h2.Stream) {
	cc := f.cc
	if f.active.Add(1) == 1 {
		cc.idleSince.Store(0)
	}
	defer func() {
		if f.active.Add(-1) == 0 {
			cc.idleSince.Store(max(Monotime(), 1))
		}
	}()
	start := time.Now()
	ls := cc.st
	ls.RequestStarted()
	ls.RqHTTP2.Inc()
	s := h2StreamStates.Get().(*h2StreamState)
	var out outcome
	var rt *route.Route
	defer func() {
		ls.RequestEnded(time.Since(start))
		if cc.logs != nil {
			f.log(s, st, rt, &out, start)
		}
		s.head, s.fields, s.scratch = s.head[:0], s.fields[:0], s.scratch[:0]
		h2StreamStates.Put(s)
	}()
	if f.overloaded(st, s, &out) { // overload.go here: 503, GOAWAY
		return
	}
	// One load: the listener's routes, its clusters and their HTTP/2
	// options are of the same publication.
	lv := cc.l.Host.View()
	method, host := st.Method(), h2Host(st)
	if method == "CONNECT" {
		out.status = streamReply(st, s, ls, 405, "CONNECT is not supported over HTTP/2 (use HTTP/1.1)")
		return
	}
	// The engine has refused (RST_STREAM PROTOCOL_ERROR) what RFC 9113
	// calls malformed; what it lets through is held to the HTTP/1.1
	// parser's rules, so that a request gets the same answer, 400,
	// whichever protocol carried it, and nothing reaches an HTTP/1.1
	// upstream's request line that would change its words: a space,
	// '\', '#' or non-ASCII byte in :path, "*" for a method other than
	// OPTIONS, an :authority that is not host[:port], no authority at
	// all, a :method and :path longer than a request line may be (414).
	if err := http1.CheckRequestParts(stringBytes(method), stringBytes(st.Path()), stringBytes(host), cc.settings.Limits); err != nil {
		e := err.(*http1.Error)
		out.status = streamReply(st, s, ls, e.Status, e.Reason)
		out.sent = int64(len(e.Reason) + 1)
		return
	}
	if lv != nil {
		s.path = http1.CleanPath(s.path[:0], stringBytes(st.Path()))
		rt = lv.Routes.Match(host, bytesString(s.path), cc.sni, (*h2RequestFields)(st))
	}
	switch {
	case rt == nil:
		out.status = streamReply(st, s, ls, 404, NoRouteBody)
		out.sent = int64(len(NoRouteBody) + 1)
	case rt.Direct != nil:
		out.status = h2DirectReply(st, s, ls, rt.Direct, method == "HEAD")
		if method != "HEAD" {
			out.sent = int64(len(rt.Direct.Body))
		}
	case rt.HTTP2:
		wc := lv.Clusters[rt.Index]
		f.proxyToHTTP2(st, s, lv, rt, cc.l.Env.http2UpstreamOf(lv, wc), start, &out)
	default:
		f.proxyToHTTP1(st, s, lv, rt, lv.Clusters[rt.Index], start, &out)
	}
}

// h2Host is the request's authority: :authority, or the host field of a
// request without one (the engine has checked that both agree).
func h2Host(st *h2.Stream) string {
	if a := st.Authority(); a != "" {
		return a
	}
	for _, hf := range st.Fields() {
		if hf.Name == "host" {
			return hf.Value
		}
	}
	return ""
}

// streamEnded reports whether the client reset the stream (or the
// connection went): nothing more to forward, nor to answer.
func streamEnded(st *h2.Stream) bool { return st.Err() != nil }

// streamReply sends one of the proxy's own plain-text responses.
func streamReply(st *h2.Stream, s *h2StreamState, ls *Stats, status int, body string) int {
	s.scratch = appendInt(s.scratch[:0], int64(len(body)+1))
	s.fields = append(s.fields[:0],
		hpack.HeaderField{Name: "content-type", Value: plainTextValue},
		hpack.HeaderField{Name: "x-content-type-options", Value: "nosniff"},
		hpack.HeaderField{Name: "content-length", Value: bytesString(s.scratch)})
	ls.Status(status)
	if st.WriteHeaders(status, s.fields, false) == nil {
		st.Write(stringBytes(body))
		st.Write(newline)
	}
	return status
}

// h2RefusalReply is the overload refusal: streamReply with Retry-After.
func h2RefusalReply(st *h2.Stream, s *h2StreamState, ls *Stats, retryAfter string) int {
	body := OverloadRefusalBody
	s.scratch = appendInt(s.scratch[:0], int64(len(body)+1))
	s.fields = append(s.fields[:0],
		hpack.HeaderField{Name: "content-type", Value: plainTextValue},
		hpack.HeaderField{Name: "x-content-type-options", Value: "nosniff"},
		hpack.HeaderField{Name: "retry-after", Value: retryAfter},
		hpack.HeaderField{Name: "content-length", Value: bytesString(s.scratch)})
	ls.Status(503)
	if st.WriteHeaders(503, s.fields, false) == nil {
		st.Write(stringBytes(body))
		st.Write(newline)
	}
	return 503
}

const plainTextValue = "text/plain; charset=utf-8"

var newline = []byte("\n")

func h2DirectReply(st *h2.Stream, s *h2StreamState, ls *Stats, d *route.DirectResponse, head bool) int {
	s.fields = s.fields[:0]
	if len(d.ContentType) > 0 {
		s.fields = append(s.fields, hpack.HeaderField{Name: "content-type", Value: d.ContentType[0]})
	}
	if len(d.ContentLength) > 0 {
		s.fields = append(s.fields, hpack.HeaderField{Name: "content-length", Value: d.ContentLength[0]})
	}
	ls.Status(d.Status)
	body := !head && len(d.Body) > 0
	if st.WriteHeaders(d.Status, s.fields, !body) == nil && body {
		st.Write(d.Body)
	}
	return d.Status
}

// log queues the request's access-log line, from the stream's own
// record (the connection's is the HTTP/1.1 path's).
func (f *h2Front) log(s *h2StreamState, st *h2.Stream, rt *route.Route, out *outcome, start time.Time) {
	cc := f.cc
	rec := &s.rec
	*rec = accesslog.Record{Start: start, HTTP2: true}
	rec.SetMethod(stringBytes(st.Method()))
	rec.SetPath(stringBytes(st.Path()))
	rec.SetClientIP(cc.clientIP)
	rec.BytesReceived = st.ContentLength()
	finishRecord(rec, out, rt, start, cc.logs, cc.st)
}

// lowerName appends name lowercased to *scratch and returns it as a
// string over those bytes (an HTTP/2 field name is lowercase; the
// engine would allocate to lowercase it).
func lowerName(scratch *[]byte, name []byte) string {
	b := *scratch
	n := len(b)
	for _, c := range name {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	*scratch = b
	return bytesString(b[n:])
}

// h2HashKeyOf is hashKey (h1retry.go) for an HTTP/2 request.
func h2HashKeyOf(h *route.HashSource, st *h2.Stream, clientIP []byte) uint64 {
	switch h.Kind {
	case route.HashSourceIP:
		return upstream.HashKey(clientIP)
	case route.HashHeader:
		for _, hf := range st.Fields() {
			if http1.EqualFold(stringBytes(hf.Name), h.Name) && hf.Value != "" {
				return upstream.HashKey(stringBytes(hf.Value))
			}
		}
	case route.HashCookie:
		for _, hf := range st.Fields() {
			if hf.Name != "cookie" {
				continue
			}
			if v, ok := cookieValue(stringBytes(hf.Value), h.Name); ok {
				return upstream.HashKey(v)
			}
		}
	}
	return 0
}

// h2ContentType is the request's content-type ("" when absent or
// repeated), for isGRPC.
func h2ContentType(st *h2.Stream) string {
	ct, n := "", 0
	for _, hf := range st.Fields() {
		if hf.Name == "content-type" {
			ct = hf.Value
			n++
		}
	}
	if n != 1 {
		return ""
	}
	return ct
}

// resetStream ends a response cut short after its head went out: the
// client must not take it for a complete one.
func resetStream(st *h2.Stream) { st.Reset(http2.ErrCodeInternal) }

// isGRPC reports whether a request's content type is gRPC's
// (application/grpc, or application/grpc+proto and the like), not
// gRPC-Web's, which HTTP/1.1 carries.
func isGRPC(contentType string) bool {
	ct, ok := strings.CutPrefix(contentType, "application/grpc")
	return ok && (ct == "" || ct[0] == '+' || ct[0] == ';')
}
