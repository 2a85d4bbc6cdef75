package workers

import (
	"errors"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/route"
	"github.com/hotproxy/hotproxy/workers/http1"
)

// An HTTP/1.1 client's request to a cluster with http2 = true: the parsed
// head becomes an http.Request for the cluster's HTTP/2 transport
// (h2upstream.go), its body is read from the client connection as the
// transport asks for it, and the response goes back in HTTP/1.1 framing.
// This path allocates (the transport's request and response); HTTP/1.1
// clusters never come here.

// proxyViaHTTP2 is the HTTP/1.1 path's hook (handle, h1handle.go): it
// forwards the request whose head is at rbuf[r:] when rt's cluster speaks
// HTTP/2, and reports whether it did and whether the client connection may
// carry another request.
func (cc *clientConn) proxyViaHTTP2(lv *listenerView, rt *route.Route, start time.Time, keep bool) (handled, keepAlive bool) {
	if !rt.HTTP2 {
		return false, keep
	}
	u := cc.m.http2UpstreamOf(cc.wk.view.Load().snap, lv.clusters[rt.Index])
	return true, cc.forwardViaHTTP2(lv, rt, u, start, keep)
}

func (cc *clientConn) forwardViaHTTP2(lv *listenerView, rt *route.Route, u *h2Upstream, start time.Time, keep bool) bool {
	req := &cc.ex.req
	head := cc.rbuf[cc.r : cc.r+req.HeadLen]
	out, err := cc.http2Request(head, u)
	cc.r += req.HeadLen
	if err != nil {
		return cc.answer(http.StatusBadRequest, "request target not understood", false)
	}
	if req.ExpectContinue && req.Framing != http1.FramingNone {
		// The transport sends the body without waiting for a 100 of
		// the upstream's; the client waits for one of ours.
		delete(out.Header, "Expect")
		if req.Minor > 0 {
			if err := cc.write([]byte("HTTP/1.1 100 Continue\r\n\r\n")); err != nil {
				return false
			}
		}
	}
	body := &h1RequestBody{cc: cc, left: req.ContentLength}
	try := h2TryRequest{
		out:        out,
		ctx:        cc.m.ctx,
		key:        cc.hashKey(&rt.HashOn, head),
		idempotent: idempotentMethod(out.Method),
	}
	switch req.Framing {
	case http1.FramingLength:
		if n := req.ContentLength; int64(cc.w-cc.r) >= n {
			// The whole body came with the head: a copy of it can
			// be sent again (retries).
			try.body = append(make([]byte, 0, n), cc.rbuf[cc.r:cc.r+int(n)]...)
			try.replayable = true
			cc.r += int(n)
			body.done = true
			out.ContentLength = n
		} else {
			out.Body, out.ContentLength = body, n
		}
	case http1.FramingChunked:
		cc.ex.reqChunks.Reset()
		body.left = -1
		out.Body, out.ContentLength = body, -1
	default:
		body.done = true
		try.replayable = true
	}
	reply, err := u.roundTrip(lv, rt, start, &try)
	if err != nil {
		// The body may be half read by the transport: stop it, and
		// close the connection after the answer.
		body.stop()
		u.wc.RecordRequest(start, false)
		if errors.Is(err, errClientBody) {
			cc.refuse(http.StatusBadRequest, "malformed or incomplete request body")
			return false
		}
		status, msg := exchange.FailureStatus(err)
		b := appendSimpleResponse(cc.ex.wbuf[:0], status, msg, true)
		cc.ex.wbuf = b
		cc.sent(status)
		cc.write(b)
		return false
	}
	resp := reply.resp
	defer reply.done()
	u.wc.RecordRequest(start, true)

	// Not req.Method's span of head: reading the body (the transport
	// did, through h1RequestBody) may have grown or compacted rbuf, and
	// head is then another connection's buffer, or the body's bytes.
	isHead := out.Method == http.MethodHead
	bodyless := isHead || resp.StatusCode == 204 || resp.StatusCode == 304 || resp.StatusCode < 200
	bodyLen := exchange.ClientBodyNone
	switch {
	case bodyless:
	case resp.ContentLength >= 0 && (len(resp.Trailer) == 0 || req.Minor == 0):
		// (Declared trailers need the chunked coding to reach an
		// HTTP/1.1 client: the next case.)
		bodyLen = resp.ContentLength
	case req.Minor > 0:
		bodyLen = exchange.ClientBodyChunked
	default:
		bodyLen, keep = exchange.ClientBodyUntilClose, false // HTTP/1.0
	}
	if cc.m.draining.Load() {
		keep = false
	}
	b := appendStatusLine(cc.ex.wbuf[:0], resp.StatusCode, "")
	for k, vs := range resp.Header {
		if h2HopByHop(k) {
			continue
		}
		for _, v := range vs {
			b = appendField(b, []byte(k), []byte(v))
		}
	}
	if bodyless && resp.ContentLength >= 0 && resp.StatusCode != 204 {
		// A HEAD or 304 response's length describes the representation.
		b = exchange.AppendHTTP1ResponseFraming(b, resp.ContentLength)
	} else {
		b = exchange.AppendHTTP1ResponseFraming(b, bodyLen)
	}
	b = appendConnection(b, req.Minor, keep)
	b = append(b, "\r\n"...)
	cc.ex.wbuf = b
	cc.sent(resp.StatusCode)
	if err := cc.write(b); err != nil {
		body.stop()
		return false
	}
	if !bodyless {
		if err := cc.copyHTTP2Body(resp, bodyLen == exchange.ClientBodyChunked); err != nil {
			body.stop()
			return false
		}
	}
	// The response is complete; a request body the upstream did not
	// read to its end leaves the connection in doubt.
	if !body.stop() {
		return false
	}
	return keep
}

// http2Request builds the transport's request from the parsed head.
func (cc *clientConn) http2Request(head []byte, u *h2Upstream) (*http.Request, error) {
	req := &cc.ex.req
	target, err := url.ParseRequestURI(string(req.Target.Bytes(head)))
	if err != nil {
		return nil, err
	}
	target.Scheme, target.Host = u.pool.Scheme(), u.wc.Name()
	out := &http.Request{
		Method:     string(req.Method.Bytes(head)),
		URL:        target,
		Proto:      "HTTP/2.0",
		ProtoMajor: 2,
		Header:     make(http.Header, req.NFields+4),
		Host:       string(req.Host.Bytes(head)),
	}
	fwd := &cc.ex.fwd
	fwd.Reset(cc.client(), req.Host.Bytes(head), true)
	for i := range req.NFields {
		if f := &req.Fields[i]; !f.Hop && fwd.Take(f.Name.Bytes(head), f.Value.Bytes(head)) {
			k := http.CanonicalHeaderKey(string(f.Name.Bytes(head)))
			out.Header[k] = append(out.Header[k], string(f.Value.Bytes(head)))
		}
	}
	addOwnFields(out.Header, fwd)
	return out, nil
}

// copyHTTP2Body sends the response body to the client, re-chunked (with
// the upstream's trailers) or as it is.
func (cc *clientConn) copyHTTP2Body(resp *http.Response, chunked bool) error {
	buf := getBuf()
	defer putBuf(buf)
	const room = 32 // chunk header and CRLF around the data
	for {
		n, err := resp.Body.Read(buf[room : len(buf)-2])
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
				b := http1.AppendLastChunk(cc.ex.wbuf[:0], appendTrailer(nil, resp.Trailer))
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

// h1RequestBody is an HTTP/1.1 request's body as the HTTP/2 transport
// reads it, on a goroutine of its own: from rbuf, then the client
// connection, de-chunked. stop ends its use of the connection before the
// connection's goroutine reads from it again.
type h1RequestBody struct {
	cc      *clientConn
	mu      sync.Mutex // held by Read; stop takes it to wait Read out
	halt    atomic.Bool
	left    int64  // Content-Length bytes still to read; -1: chunked
	pending []byte // decoded chunk data not yet returned (in rbuf)
	done    bool   // the body ended where its framing says
	failed  bool
}

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
			n, data, _, end, err := cc.ex.reqChunks.Next(cc.rbuf[cc.r:cc.w])
			if err != nil {
				b.failed = true
				continue
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
		cc.setReadDeadline(cc.settings.idleTimeout)
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

func (b *h1RequestBody) Close() error { return nil }

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

// appendTrailer writes trailer fields as HTTP/1.1 field lines, leaving
// out those a trailer may not carry (framing, routing, hop-by-hop).
func appendTrailer(b []byte, trailer http.Header) []byte {
	for name, values := range trailer {
		switch name {
		case "Content-Length", "Transfer-Encoding", "Host", "Connection", "Keep-Alive", "Te", "Trailer", "Upgrade":
			continue
		}
		for _, v := range values {
			b = append(b, name...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	return b
}
