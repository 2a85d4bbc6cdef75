package httpfront

import (
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2/hpack"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/route"
)

// An HTTP/1.1 client's request to a cluster with http2 = true: the parsed
// head becomes header fields of an HTTP/2 request (exchange.H2Transport,
// over upstream.H2Pool) over the read buffer's bytes, a body that came
// whole with the head goes with the HEADERS of every try, one that still
// streams is read from the client connection as the transport's pump
// asks for it, and the response goes back in HTTP/1.1 framing (chunked
// with the upstream's trailers to an HTTP/1.1 client when there is no
// length or the response declares trailers). HTTP/1.1 clusters never
// come here.

// h1ToH2 is the state of an HTTP/1.1 client's exchange with an HTTP/2
// upstream, kept with the connection's pooled state.
type h1ToH2 struct {
	up    exchange.H2Transport
	tries exchange.Tries
	body  h1RequestBody
	path  []byte // an absolute-form target's path
}

// proxyViaHTTP2 is the HTTP/1.1 path's hook (handle, h1handle.go): it
// forwards the request whose head is at rbuf[r:] when rt's cluster speaks
// HTTP/2, and reports whether it did and whether the client connection may
// carry another request.
func (cc *Conn) proxyViaHTTP2(lv *View, rt *route.Route, start time.Time, keep bool) (handled, keepAlive bool) {
	if !rt.HTTP2 {
		return false, keep
	}
	u := cc.l.Env.http2UpstreamOf(lv, lv.Clusters[rt.Index])
	return true, cc.forwardViaHTTP2(rt, u, start, keep)
}

func (cc *Conn) forwardViaHTTP2(rt *route.Route, u *h2Upstream, start time.Time, keep bool) bool {
	req := &cc.ex.req
	head := cc.rbuf[cc.r : cc.r+req.HeadLen]
	if cc.ex.toH2 == nil {
		cc.ex.toH2 = new(h1ToH2)
	}
	h := cc.ex.toH2
	x := &h.up
	x.Reset(u.pool, cc.l.Env.Ctx, cc.hashKey(&rt.HashOn, head))
	defer x.Reset(nil, nil, 0) // the pool keeps no stream or pool
	path, ok := h.originPath(req.Target.Bytes(head))
	cc.r += req.HeadLen
	if !ok {
		return cc.answer(400, "request target not understood", false)
	}
	// The head's spans stay valid while the tries run: nothing is read
	// from the client until a streamed body's pump starts, and then
	// there is one try, whose head went out already.
	method := bytesString(req.Method.Bytes(head))
	isHead := method == "HEAD"
	x.Head.Method, x.Head.Scheme, x.Head.Authority, x.Head.Path = method, u.pool.Scheme(), bytesString(req.Host.Bytes(head)), bytesString(path)
	fwd := &cc.ex.fwd
	fwd.Reset(cc.client(), req.Host.Bytes(head), true)
	expect := req.ExpectContinue && req.Framing != http1.FramingNone
	for i := range req.NFields {
		f := &req.Fields[i]
		name, value := f.Name.Bytes(head), f.Value.Bytes(head)
		if f.Hop {
			// The fields Connection names are stripped here and
			// must not come back in the trailer.
			if req.Framing == http1.FramingChunked && http1.EqualFold(name, "connection") {
				fwd.NoteConnection(value)
			}
			continue
		}
		if !fwd.Take(name, value) {
			continue
		}
		if expect && len(name) == 6 && http1.EqualFold(name, "expect") {
			// The upstream's 100 is not awaited; the client gets
			// ours below.
			continue
		}
		x.AddField(name, value)
	}
	if expect && req.Minor > 0 {
		if err := cc.write([]byte("HTTP/1.1 100 Continue\r\n\r\n")); err != nil {
			return false
		}
	}
	body := &h.body
	*body = h1RequestBody{cc: cc, left: req.ContentLength}
	replayable := true
	switch req.Framing {
	case http1.FramingLength:
		if n := req.ContentLength; int64(cc.w-cc.r) >= n {
			// The whole body came with the head: it can be sent
			// again (retries), from rbuf, which no read touches
			// until the exchange ends.
			x.Head.Body = cc.rbuf[cc.r : cc.r+int(n)]
			cc.r += int(n)
			body.done = true
		} else {
			x.Body, replayable = body, false
		}
		x.AddOwnFields(fwd, req.ContentLength)
	case http1.FramingChunked:
		cc.ex.reqChunks.Reset()
		body.left = -1
		x.Body, replayable = body, false
		x.AddOwnFields(fwd, -1)
	default:
		body.done = true
		x.AddOwnFields(fwd, -1)
	}
	t := &h.tries
	t.Start(&rt.Retry, u.wc, start, rt.Timeout, replayable, exchange.Idempotent(method))
	err := x.Run(t, u.wc)
	if err != nil {
		// The body may be half read by the pump: stop it, and close
		// the connection after the answer.
		body.stop()
		x.Finish()
		u.wc.RecordRequest(start, false)
		if errors.Is(err, errClientBody) {
			cc.refuse(400, "malformed or incomplete request body")
			return false
		}
		status, msg := exchange.FailureStatus(err)
		b := appendSimpleResponse(cc.ex.wbuf[:0], status, msg, true)
		cc.ex.wbuf = b
		cc.sent(status)
		cc.write(b)
		return false
	}
	u.wc.RecordRequest(start, true)
	up := x.Up.Stream
	status := x.Status
	bodyless := isHead || status == 204 || status == 304 || status < 200
	contentLength := up.ContentLength()
	declaresTrailers := false
	for _, f := range x.Fields {
		if f.Name == "trailer" {
			declaresTrailers = true
		}
	}
	bodyLen := exchange.ClientBodyNone
	switch {
	case bodyless:
	case contentLength >= 0 && (!declaresTrailers || req.Minor == 0):
		// (Declared trailers need the chunked coding to reach an
		// HTTP/1.1 client: the next case.)
		bodyLen = contentLength
	case req.Minor > 0:
		bodyLen = exchange.ClientBodyChunked
	default:
		bodyLen, keep = exchange.ClientBodyUntilClose, false // HTTP/1.0
	}
	if cc.l.Draining.Load() {
		keep = false
	}
	b := appendStatusLine(cc.ex.wbuf[:0], status, "")
	for _, f := range x.Fields {
		if h2ResponseFieldDropped(f.Name) || f.Name == "content-length" {
			continue
		}
		b = appendCanonicalName(b, f.Name)
		b = append(b, ": "...)
		b = append(b, f.Value...)
		b = append(b, "\r\n"...)
	}
	if bodyless && contentLength >= 0 && status != 204 {
		// A HEAD or 304 response's length describes the representation.
		b = exchange.AppendHTTP1ResponseFraming(b, contentLength)
	} else {
		b = exchange.AppendHTTP1ResponseFraming(b, bodyLen)
	}
	b = appendConnection(b, req.Minor, keep)
	b = append(b, "\r\n"...)
	cc.ex.wbuf = b
	cc.sent(status)
	if err := cc.write(b); err != nil {
		body.stop()
		x.Finish()
		return false
	}
	if !bodyless {
		if err := cc.copyHTTP2Body(up, bodyLen == exchange.ClientBodyChunked); err != nil {
			body.stop()
			x.Finish()
			return false
		}
	}
	// The response is complete; a request body the upstream did not
	// read to its end leaves the connection in doubt.
	clean := body.stop()
	x.Finish()
	return clean && keep
}

// originPath is the :path of an HTTP/1.1 request target: an origin-form
// target as it is, "*" (OPTIONS), or an absolute-form target's path and
// query (in h.path; "/" when it has none).
func (h *h1ToH2) originPath(target []byte) ([]byte, bool) {
	if len(target) > 0 && (target[0] == '/' || string(target) == "*") {
		return target, true
	}
	i := strings.Index(bytesString(target), "://")
	if i <= 0 {
		return nil, false
	}
	rest := target[i+3:]
	j := 0
	for j < len(rest) && rest[j] != '/' && rest[j] != '?' {
		j++
	}
	h.path = append(h.path[:0], '/')
	if j < len(rest) {
		if rest[j] == '/' {
			h.path = h.path[:0]
		}
		h.path = append(h.path, rest[j:]...)
	}
	return h.path, true
}

// h2ResponseFieldDropped: response fields an HTTP/2 upstream's response
// does not pass on (the connection-specific ones its client refuses as
// malformed already): TE, Trailer (the proxy frames trailers itself) and
// Proxy-Authenticate (the proxy's own to ask, not the origin's).
func h2ResponseFieldDropped(name string) bool {
	switch name {
	case "te", "trailer", "proxy-authenticate":
		return true
	}
	return false
}

// appendCanonicalName appends an HTTP/2 (lower-case) field name in the
// form HTTP/1.1 peers are used to: Content-Type, X-Request-Id.
func appendCanonicalName(b []byte, name string) []byte {
	upper := true
	for i := 0; i < len(name); i++ {
		c := name[i]
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		upper = c == '-'
		b = append(b, c)
	}
	return b
}

// copyHTTP2Body sends the response body to the client, re-chunked (with
// the upstream's trailers) or as it is.
func (cc *Conn) copyHTTP2Body(up io.Reader, chunked bool) error {
	buf := getBuf()
	defer putBuf(buf)
	const room = 32 // chunk header and CRLF around the data
	for {
		n, err := up.Read(buf[room : len(buf)-2])
		if n > 0 {
			out := buf[room : room+n]
			if chunked {
				h := http1.AppendChunkHeader(cc.ex.wbuf[:0], n)
				start := room - len(h)
				copy(buf[start:], h)
				out = append(buf[start:room+n], "\r\n"...)
			}
			if werr := cc.write(out); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			if chunked {
				var tr []hpack.HeaderField
				if s, ok := up.(interface{ Trailers() []hpack.HeaderField }); ok {
					tr = s.Trailers()
				}
				b := http1.AppendLastChunk(cc.ex.wbuf[:0], exchange.AppendHTTP1Trailers(nil, tr, appendCanonicalName))
				cc.ex.wbuf = b
				return cc.write(b)
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// h1RequestBody is an HTTP/1.1 request's body as the HTTP/2 transport's
// pump reads it, on a goroutine of its own: from rbuf, then the client
// connection, de-chunked. stop ends its use of the connection before the
// connection's goroutine reads from it again.
type h1RequestBody struct {
	cc      *Conn
	mu      sync.Mutex // held by Read; stop takes it to wait Read out
	halt    atomic.Bool
	left    int64  // Content-Length bytes still to read; -1: chunked
	pending []byte // decoded chunk data not yet returned (in rbuf)
	done    bool   // the body ended where its framing says
	failed  bool
	// trailers: the chunked trailer's fields that pass, once the body
	// ended (Trailers).
	trailers []hpack.HeaderField
}

var _ exchange.H2Body = (*h1RequestBody)(nil)

var errBodyStopped = errors.New("request body no longer read")

func (b *h1RequestBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cc := b.cc
	for {
		if b.halt.Load() {
			return 0, errBodyStopped
		}
		if b.done {
			return 0, io.EOF
		}
		if b.failed {
			return 0, errClientBody
		}
		if len(b.pending) > 0 {
			n := copy(p, b.pending)
			b.pending = b.pending[n:]
			return n, nil
		}
		if b.left > 0 && cc.r < cc.w {
			n := copy(p, cc.rbuf[cc.r:cc.r+int(min(b.left, int64(cc.w-cc.r)))])
			cc.r += n
			b.left -= int64(n)
			b.done = b.left == 0
			return n, nil
		}
		if b.left < 0 && cc.r < cc.w {
			n, data, trailer, end, err := cc.ex.reqChunks.Next(cc.rbuf[cc.r:cc.w])
			if err != nil {
				b.failed = true
				continue
			}
			if end && len(trailer) > 0 {
				// Copied out now: rbuf is read into again once
				// the body is done.
				b.trailers = cc.ex.fwd.AppendHTTP2RequestTrailer(b.trailers[:0], trailer)
			}
			if n > 0 {
				// data stays valid: rbuf is refilled only once it
				// has been returned.
				cc.r += n
				b.pending = data
				b.done = end && len(data) == 0
				if end && len(data) > 0 {
					b.left = 0 // after pending, EOF
				}
				continue
			}
		}
		if b.left == 0 {
			b.done = true
			continue
		}
		// Read more from the client.
		if !cc.roomForBody() {
			b.failed = true // a chunk line larger than the buffer
			continue
		}
		// Deadline first, then the flag: stop sets the flag and then a
		// deadline in the past (as waitPump does for the pump).
		cc.setReadDeadline(cc.settings.IdleTimeout)
		if b.halt.Load() {
			return 0, errBodyStopped
		}
		if err := cc.read(); err != nil {
			if b.halt.Load() {
				return 0, errBodyStopped
			}
			b.failed = true
		}
	}
}

// Trailers are the fields of the client's chunked trailer section that
// the request trailer rule lets through (exchange.RequestTrailerMayCarry,
// and none that the head's Connection named), once Read returned io.EOF.
func (b *h1RequestBody) Trailers() []hpack.HeaderField {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.trailers
}

// stop ends the body's reads of the client connection, waiting for one
// in progress, and reports whether the body had ended cleanly.
func (b *h1RequestBody) stop() bool {
	b.halt.Store(true)
	b.cc.c.SetReadDeadline(aLongTimeAgo)
	b.mu.Lock()
	ok := b.done && len(b.pending) == 0
	b.mu.Unlock()
	// The read deadline is spoiled: the next read sets its own.
	b.cc.readDeadline = aLongTimeAgo
	return ok
}
