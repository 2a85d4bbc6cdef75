package httpfront

import (
	"io"
	"net"
	"sync"
	"time"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/upstream"
)

// appendResponseHead writes the upstream's response head as the client gets
// it: hop-by-hop fields removed, framing of the proxy's own (bodyLen: a
// Content-Length, or exchange.ClientBodyNone, ...Chunked, ...UntilClose), and whether
// the connection stays open. Content-Type is never added.
func (cc *Conn) appendResponseHead(b, head []byte, keep bool, bodyLen int64) []byte {
	resp := &cc.ex.resp
	b = appendStatusLine(b, resp.Status, bytesString(resp.Reason.Bytes(head)))
	for i := range resp.NFields {
		f := &resp.Fields[i]
		name := f.Name.Bytes(head)
		if f.Hop {
			if exchange.PassesRepresentationLength(name, resp.Status, bodyLen == exchange.ClientBodyNone) {
				b = appendField(b, name, f.Value.Bytes(head))
			}
			continue
		}
		if isProxyAuth(name) {
			continue
		}
		b = appendField(b, name, f.Value.Bytes(head))
	}
	b = exchange.AppendHTTP1ResponseFraming(b, bodyLen)
	if resp.Status >= 200 {
		b = appendConnection(b, cc.ex.req.Minor, keep)
	}
	return append(b, "\r\n"...)
}

func appendField(b, name, value []byte) []byte {
	b = append(b, name...)
	b = append(b, ": "...)
	b = append(b, value...)
	return append(b, "\r\n"...)
}

// forwardResponse sends the parsed final response and its body to the
// client and settles the upstream connection. It reports whether the
// client connection may carry another request.
func (x *h1Exchange) forwardResponse(keep bool) bool {
	cc := x.cc
	ex := cc.ex
	resp := &ex.resp
	req := &ex.req
	status := resp.Status
	if status == 101 {
		if !x.upgrade || !x.bodyDone {
			return cc.failBeforeResponse(x, &http1.Error{Status: 502, Reason: "101 to a request that asked for no upgrade"})
		}
		if namesHTTP2(upgradeOf(&resp.Fields, resp.NFields, x.in.B[x.in.R:x.in.R+resp.HeadLen])) {
			// Only h2c or h2 can have been taken out of the request's
			// Upgrade (appendUpgrade): an upstream that switches to one
			// anyway would open HTTP/2 past routing.
			return cc.failBeforeResponse(x, &http1.Error{Status: 502, Reason: "101 to HTTP/2, which was not asked for"})
		}
		cc.sent(101) // downstream_rq_1xx, and the access log's status
		// The tunnel gives the connection's state back to its pool:
		// nothing of x may be touched after it.
		x.tunnel()
		return false
	}
	defer func() {
		if x.in.B != nil {
			cc.giveBuf(x.in.B)
			x.in.B = nil
		}
	}()

	// The request body may still be coming: an early answer. The client
	// connection then closes after it, and the upstream one is not reused.
	// But a pump that has read the client's whole body is only finishing
	// its last write to the upstream (a backend that read the body may
	// answer before the pump reports, most often when the body did not
	// fit the small buffer the head came in): it is waited for, bounded
	// by the upstream write deadline as waitPump is, and the client
	// connection stays open.
	upBroken := false
	if x.pump != nil {
		if x.bodyRead.Load() {
			upBroken = <-x.pump != nil
			x.pump = nil
		} else {
			select {
			case err := <-x.pump:
				x.pump = nil
				if err != nil {
					return cc.failBeforeResponse(x, err)
				}
			default:
				keep = false
			}
		}
	}
	head := x.in.B[x.in.R : x.in.R+resp.HeadLen]
	x.in.R += resp.HeadLen
	var bodyLen int64
	switch resp.Framing {
	case http1.FramingNone:
		bodyLen = exchange.ClientBodyNone
	case http1.FramingLength:
		bodyLen = resp.ContentLength
	case http1.FramingChunked:
		bodyLen = exchange.ClientBodyChunked
		if req.Minor == 0 {
			// HTTP/1.0 has no chunks: the body is de-chunked and ends
			// with the connection.
			bodyLen, keep = exchange.ClientBodyUntilClose, false
		}
	case http1.FramingUntilClose:
		bodyLen, keep = exchange.ClientBodyUntilClose, false
	}
	if cc.l.Draining.Load() {
		keep = false
	}
	h := cc.appendResponseHead(ex.wbuf[:0], head, keep, bodyLen)
	ex.wbuf = h
	cc.sent(status)

	upClean := !resp.Close && !upBroken
	// A keep-alive response's last write may wait for the idle wait that
	// follows (writeLast), in plaintext, with nothing pipelined behind it.
	cc.deferLast = keep && cc.tls == nil && x.pump == nil && cc.r == cc.w
	cc.closeLast = !keep && cc.tls == nil && x.pump == nil
	var err error
	switch resp.Framing {
	case http1.FramingNone:
		err = cc.writeLast(h)
	case http1.FramingLength:
		err = x.copyLength(h, resp.ContentLength)
	case http1.FramingChunked:
		err = x.copyChunked(h, req.Minor > 0)
	case http1.FramingUntilClose:
		err = x.copyUntilClose(h)
		upClean = false
	}
	cc.deferLast, cc.closeLast = false, false
	if err != nil {
		keep, upClean = false, false
	}
	if x.in.R != x.in.W {
		// Bytes after the response: the upstream's framing is in
		// doubt.
		upClean = false
	}
	x.up.Release(upClean && x.pump == nil)
	if x.pump != nil {
		// The response is complete and the body is not: stop reading
		// it; the connection cannot carry another request. The client
		// may still be sending: a lingering close lets it read the
		// answer rather than a reset.
		x.waitPump(true)
		if err == nil {
			cc.lingerClose()
		}
		return false
	}
	return keep
}

// ReadUpstream reads more of the response into the upstream buffer
// (exchange.ReadMore). A body streams through the large buffer: the
// small one the head was read into is swapped for it at the first
// refill.
func (x *h1Exchange) ReadUpstream() error {
	return exchange.ReadMore(x.up, &x.in, IOBufSize, x, &x.bodyDeadline, x.cc.settings.IdleTimeout)
}

// GrowReadBuffer moves the unread bytes to the front of a large buffer and
// gives the small one back. Spans into ub are stale after it: the head is
// parsed again (readResponseHead), or it was already copied out.
func (x *h1Exchange) GrowReadBuffer() {
	nb := x.cc.takeBuf(IOBufSize)
	x.in.W = copy(nb, x.in.B[x.in.R:x.in.W])
	x.in.R = 0
	x.cc.giveBuf(x.in.B)
	x.in.B = nb
}

// copyLength sends head and a body of n bytes: head and what is buffered
// in one write, then the rest as it comes.
func (x *h1Exchange) copyLength(head []byte, n int64) error {
	cc := x.cc
	x.bodyDeadline = time.Time{}
	if x.in.W == len(x.in.B) && len(x.in.B) < IOBufSize && x.in.R < x.in.W && int64(x.in.W-x.in.R) < n {
		// The head came with the start of its body and filled the
		// small buffer: the rest is most likely there already. One
		// more read, into the large buffer, so that head and body
		// still go out in one write.
		if err := x.ReadUpstream(); err != nil {
			return err
		}
	}
	k := min(n, int64(x.in.W-x.in.R))
	cc.deferLast = cc.deferLast && k == n // only the response's last write
	cc.closeLast = cc.closeLast && k == n
	if err := cc.writeHeadAnd(head, x.in.B[x.in.R:x.in.R+int(k)]); err != nil {
		return err
	}
	x.in.R += int(k)
	return exchange.CopyLength(&x.in, n-k, x)
}

// WriteBody writes a piece of the response body to the client
// (exchange.BodySink); the last one is no different on HTTP/1.1.
func (x *h1Exchange) WriteBody(p []byte, _ bool) error { return x.cc.write(p) }

// writeHeadAnd writes head and body, in one write when small.
func (cc *Conn) writeHeadAnd(head, body []byte) error {
	if len(body) == 0 {
		return cc.writeLast(head)
	}
	if len(head)+len(body) <= cap(head) || len(body) <= inlineBodyMax {
		b := append(head, body...)
		cc.ex.wbuf = b
		return cc.writeLast(b)
	}
	cc.deferLast = false
	bufs := net.Buffers{head, body}
	return cc.writev(&bufs)
}

// writeLast writes b or, when it is a keep-alive response's last write
// (cc.deferLast, set by forwardResponse), leaves it in cc.pending for the
// idle wait that follows to write from inside the wait (waitReadable):
// written after Go's poller has reset the socket's readiness, a request
// that follows the response wakes the wait, so the wait needs no peek at
// the socket first, a recvfrom(2) that returns EAGAIN on most requests.
// b is in the connection's state (wbuf), which the wait gives back only
// after writing. The bytes count for the access log now, since its record
// is written before they go out (a failed write then ends the
// connection, as it would have).
func (cc *Conn) writeLast(b []byte) error {
	if !cc.deferLast {
		if cc.closeLast {
			return cc.writeBeforeClose(b)
		}
		return cc.write(b)
	}
	cc.deferLast = false
	cc.pending = b
	cc.sentBytes += int64(len(b))
	return nil
}

// copyChunked sends head and a chunked body, re-encoded (rechunk) or
// de-chunked for an HTTP/1.0 client, gathered in wbuf and written a
// buffer at a time (Chunk, FlushChunks).
func (x *h1Exchange) copyChunked(head []byte, rechunk bool) error {
	cc := x.cc
	cc.ex.wbuf = append(cc.ex.wbuf[:0], head...)
	x.rechunk = rechunk
	x.bodyDeadline = time.Time{}
	return exchange.CopyChunked(&x.in, &cc.ex.respChunks, x)
}

// Chunk adds a chunk of the upstream's body to wbuf, re-encoded or not,
// and writes wbuf once it holds a buffer's worth, or the last chunk
// (exchange.ChunkSink).
func (x *h1Exchange) Chunk(data, trailer []byte, done bool) error {
	cc := x.cc
	out := cc.ex.wbuf
	if x.rechunk {
		out = appendChunk(out, data, trailer, done)
	} else {
		out = append(out, data...)
	}
	if len(out) >= IOBufSize || (done && len(out) > 0) {
		if err := cc.write(out); err != nil {
			cc.ex.wbuf = out
			return err
		}
		out = out[:0]
	}
	cc.ex.wbuf = out
	return nil
}

// FlushChunks writes what wbuf holds before the wait for more of the
// body (exchange.ChunkSink).
func (x *h1Exchange) FlushChunks() error {
	cc := x.cc
	if out := cc.ex.wbuf; len(out) > 0 {
		if err := cc.write(out); err != nil {
			return err
		}
		cc.ex.wbuf = out[:0]
	}
	return nil
}

// copyUntilClose sends head and the body up to the upstream's EOF.
func (x *h1Exchange) copyUntilClose(head []byte) error {
	cc := x.cc
	if err := cc.writeHeadAnd(head, x.in.B[x.in.R:x.in.W]); err != nil {
		return err
	}
	x.in.R = x.in.W
	x.bodyDeadline = time.Time{}
	return exchange.CopyUntilClose(&x.in, x)
}

// upgradeOf is the value of a response head's first Upgrade field, or
// nil.
func upgradeOf(fields *[http1.MaxHeaders]http1.Field, n int, head []byte) []byte {
	for i := range n {
		f := &fields[i]
		if http1.EqualFold(f.Name.Bytes(head), "upgrade") {
			return f.Value.Bytes(head)
		}
	}
	return nil
}

// tunnel relays bytes both ways after a 101 (WebSocket and other
// upgrades), until both directions end or the connection is closed by a
// drain. The connection's buffers go back to their pools first: a tunnel
// can live for hours.
func (x *h1Exchange) tunnel() {
	cc := x.cc
	resp := &cc.ex.resp
	head := x.in.B[x.in.R : x.in.R+resp.HeadLen]
	x.in.R += resp.HeadLen
	h := cc.appendResponseHead(cc.ex.wbuf[:0], head, true, -1)
	h = append(h[:len(h)-2], "Connection: upgrade\r\nUpgrade: "...)
	h = append(h, upgradeOf(&resp.Fields, resp.NFields, head)...)
	h = append(h, "\r\n\r\n"...)
	cc.ex.wbuf = h
	err := cc.writeHeadAnd(h, x.in.B[x.in.R:x.in.W])
	x.in.R = x.in.W
	if err == nil && cc.r < cc.w {
		_, err = x.up.Write(cc.rbuf[cc.r:cc.w])
		cc.r = cc.w
	}
	if err != nil {
		x.up.Discard()
		return
	}
	up := x.up
	// x lives in the state released by relay: only locals from now on.
	cc.giveBuf(x.in.B)
	x.in.B = nil
	cc.relay(up.Stream())
	up.Discard()
}

// relay copies bytes both ways between the client and up (a tunnel: an
// upgrade or a CONNECT) until both directions have ended or the drain
// closes the client connection, half-closing each side as the other ends.
// Between two TCP sockets the copies are splice(2); TLS bytes, on
// either side, go through user space (io.Copy's buffer), as they must be
// decrypted or encrypted. The connection's buffers and state go back to
// their pools first: a tunnel can live for hours. The caller closes up.
func (cc *Conn) relay(up upstream.Stream) {
	cc.c.SetDeadline(time.Time{})
	cc.readDeadline, cc.writeDeadline = time.Time{}, time.Time{}
	up.SetDeadline(time.Time{})
	cc.releaseState()

	client := cc.c
	if cc.tls == nil {
		// The socket as a net.TCPConn (a dup, closed with the
		// connection), whose copies to and from up splice.
		if tc, err := cc.tcp.NetConn(); err == nil {
			client = tc
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		n, _ := io.Copy(up, client)
		cc.st.RxBytes.Add(uint64(n))
		up.CloseWrite()
	}()
	n, _ := io.Copy(client, up)
	cc.st.TxBytes.Add(uint64(n))
	cc.closeWrite()
	wg.Wait()
}
