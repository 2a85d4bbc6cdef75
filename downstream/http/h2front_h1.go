package httpfront

import (
	"bytes"
	"errors"
	"io"
	"net"
	"time"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/h2"
	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/route"
	"github.com/hotproxy/hotproxy/upstream"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// An HTTP/2 stream proxied to an HTTP/1.1 cluster: the request head is
// written with the HTTP/1.1 codec's rules from the stream's fields, sent
// on a connection of the worker's pool (with the body when the engine has
// buffered it whole: then the request may be tried again), the response
// head parsed in place (exchange.ReadHTTP1Head) and written to the stream
// as header fields over the read buffer's bytes: no allocation per
// request. A body that still streams from the client is pumped on a
// goroutine of its own, which ends before ServeH2 returns.

// h2StreamExchange is one such request's state, in the stream's pooled
// state (handed to the core's interfaces, it would escape to the heap).
type h2StreamExchange struct {
	f          *h2Front
	st         *h2.Stream
	s          *h2StreamState
	wc         *upstream.WorkerCluster
	up         *upstream.Conn
	resp       http1.Response
	chunks     http1.ChunkedDecoder
	streaming  bool // the body streams from the client (never resent)
	idempotent bool
	method     []byte // for the response's framing (HEAD)
	in         exchange.ReadBuffer
	// bodyDeadline is the read deadline last set while the response
	// body is copied (ReadUpstream).
	bodyDeadline time.Time
	// pump reports the streamed body's end; nil while none runs.
	pump  chan error
	tries exchange.Tries
	key   uint64 // hash_on key
	sent  int64  // body bytes written to the client
	// last is a response's last bytes, which copyLength leaves for the
	// frame that ends the stream, written once the upstream connection
	// is back in its pool: a client that sends its next request as soon
	// as the stream ends must find it there, not dial another.
	last     []byte
	flushed  bool // nothing written since the last Flush
	headSent bool // a response head went to the client
}

func (f *h2Front) proxyToHTTP1(st *h2.Stream, s *h2StreamState, lv *View, rt *route.Route, wc *upstream.WorkerCluster, start time.Time, out *outcome) {
	cc := f.cc
	x := &s.xchg
	*x = h2StreamExchange{f: f, st: st, s: s, wc: wc, method: methodOther}
	defer func() {
		x.stopPump()
		if x.in.B != nil {
			putBuf(x.in.B)
		}
		*x = h2StreamExchange{} // the pool keeps no stream or connection
	}()
	if isGRPC(h2ContentType(st)) {
		// Sent on all the same (the upstream may bridge), but a gRPC
		// server answers HTTP/1.1 with bytes that are no response: every
		// call a 502, and the operator would be told nothing.
		cc.l.Env.GRPCToHTTP1.Warn("a gRPC request is routed to a cluster that speaks HTTP/1.1; gRPC needs HTTP/2 to its server: set http2 = true on the cluster",
			"listener", cc.l.Name, "cluster", wc.Name(), "path", st.Path())
	}
	method := st.Method()
	x.idempotent = exchange.Idempotent(method)
	if method == "HEAD" {
		x.method = methodHEAD
	}
	body, complete := st.Body()
	x.streaming = !complete
	// A buffered body that came with trailers goes chunked, to carry
	// them.
	trailers := complete && len(st.Trailers()) > 0
	s.head = x.appendHead(s.head[:0], wc.Name(), len(body), trailers)
	switch {
	case trailers:
		// Head and body in one write, and again for a retry.
		if len(body) > 0 {
			s.head = http1.AppendChunkHeader(s.head, len(body))
			s.head = append(append(s.head, body...), crlf...)
		}
		s.pumpBuf = exchange.AppendHTTP1RequestTrailers(s.pumpBuf[:0], st.Trailers(), appendName)
		s.head = http1.AppendLastChunk(s.head, s.pumpBuf)
	case complete:
		s.head = append(s.head, body...)
	}
	err := x.tryUntilResponse(rt, start)
	if x.up != nil {
		out.upAddr = x.up.Endpoint()
	}
	out.retries = x.tries.Retries
	if err == nil && x.streaming {
		x.startPump()
		err = x.readResponseHead()
	}
	if err == nil && x.resp.Status == 101 {
		err = &http1.Error{Status: 502, Reason: "101 over HTTP/2"}
	}
	if err == nil && x.pump != nil {
		// A client body that failed before the response is the
		// client's fault, not the upstream's.
		select {
		case perr := <-x.pump:
			x.pump = nil
			err = perr
		default:
		}
	}
	if err != nil {
		out.status = x.fail(err, start)
		return
	}
	wc.RecordRequest(start, true)
	wc.ReportStatus(x.up.EndpointIndex(), x.resp.Status)
	out.status = x.resp.Status
	ok := x.forwardResponse()
	out.sent = x.sent
	if !ok {
		resetStream(st)
	}
}

// appendHead writes the HTTP/1.1 request head: Host from the authority,
// the fields exchange.ForwardedFields keeps (the engine has refused
// HTTP/1.1's connection-specific ones) and adds, and framing of the
// proxy's own: Content-Length for a buffered body or a declared length,
// chunked otherwise.
func (x *h2StreamExchange) appendHead(b []byte, upstreamHost string, buffered int, chunked bool) []byte {
	st := x.st
	cc := x.f.cc
	host := stringBytes(h2Host(st))
	b = exchange.AppendHTTP1RequestLine(b, stringBytes(st.Method()), stringBytes(st.Path()), host, upstreamHost)
	fwd := &x.s.fwd
	fwd.Reset(cc.client(), host, false)
	for _, hf := range st.Fields() {
		name, value := stringBytes(hf.Name), stringBytes(hf.Value)
		if hf.Name == "host" {
			continue // the request line's Host
		}
		if fwd.Take(name, value) {
			b = appendField(b, name, value)
		}
	}
	b = fwd.AppendHTTP1(b)
	method := st.Method()
	switch {
	case chunked:
		b = exchange.AppendHTTP1Framing(b, exchange.BodyChunked)
	case !x.streaming && buffered > 0:
		b = exchange.AppendHTTP1Framing(b, int64(buffered))
	case x.streaming && st.ContentLength() >= 0:
		b = exchange.AppendHTTP1Framing(b, st.ContentLength())
	case x.streaming:
		b = exchange.AppendHTTP1Framing(b, exchange.BodyChunked)
	case method == "POST" || method == "PUT" || method == "PATCH":
		// An empty body said so: some servers wait for a body of a
		// POST that gives no length.
		b = exchange.AppendHTTP1Framing(b, 0)
	}
	return append(b, "\r\n"...)
}

// tryUntilResponse sends the head (and a buffered body) and, unless the
// body streams, reads the response head, trying again where the route's
// retry policy (exchange.Tries) says so. A streamed body is tried once.
func (x *h2StreamExchange) tryUntilResponse(rt *route.Route, start time.Time) error {
	t := &x.tries
	t.Start(&rt.Retry, x.wc, start, rt.Timeout, !x.streaming, x.idempotent)
	x.key = h2HashKeyOf(&rt.HashOn, x.st, x.f.cc.clientIP)
	err := exchange.RoundTrip(t, x)
	if err == nil && t.PerTry() {
		x.up.SetDeadline(t.Deadline())
	}
	return err
}

var (
	_ exchange.UpstreamTransport = (*h2StreamExchange)(nil)
	_ exchange.HeadReadHooks     = (*h2StreamExchange)(nil)
)

var crlf = []byte("\r\n")

// errStreamReset: the client reset the stream before it was forwarded.
var errStreamReset = errors.New("client reset the HTTP/2 stream")

// Try sends the request once on a connection of the cluster's HTTP/1.1
// pool (exchange.UpstreamTransport) and, unless its body streams, reads
// the response head.
func (x *h2StreamExchange) Try(n, avoid int, fresh bool, tryDeadline time.Time) (int, exchange.Try, error) {
	none := exchange.Try{Endpoint: -1}
	if streamEnded(x.st) {
		return 0, none, errStreamReset // dial nothing (Rapid Reset)
	}
	var err error
	x.up, err = x.wc.AcquireTry(x.f.cc.l.Env.Ctx, x.key, n, avoid, fresh, x.idempotent && !x.streaming)
	if err != nil {
		x.up = nil
		return 0, none, err
	}
	if streamEnded(x.st) {
		// Reset while a connection was found: nothing was sent on it,
		// so it goes back to the pool as it came.
		x.up.Release(true)
		x.up = nil
		return 0, none, errStreamReset
	}
	x.up.SetTryDeadline(tryDeadline, x.tries.DeadlineSlack())
	status := 0
	if x.streaming {
		_, err = x.up.Write(x.s.head)
	} else if err = x.sendThenReadHead(); err == nil {
		status = x.resp.Status
	}
	return status, exchange.Try{Endpoint: x.up.EndpointIndex(), Stale: x.up.Reused() && x.in.W == 0}, err
}

// Abandon closes the try's connection: a response to repeat is read no
// further.
func (x *h2StreamExchange) Abandon() { exchange.AbandonHTTP1(&x.up, &x.in) }

// sendThenReadHead sends the request, whose body (if any) is in the head
// buffer, and reads the response head without the read(2) that would
// return EAGAIN right after the write (upstream.Conn.SendThenRead waits
// first, then reads): one system call and one poller wake fewer per
// request.
func (x *h2StreamExchange) sendThenReadHead() error {
	if x.in.B == nil {
		x.in.B = getBuf()
	}
	if err := exchange.SendThenRead(x.up, x.s.head, nil, &x.in, x); err != nil {
		return err
	}
	return x.readResponseHead()
}

func (x *h2StreamExchange) readResponseHead() error {
	if x.in.B == nil {
		x.in.B = getBuf()
	}
	return exchange.ReadHTTP1Head(x.up, &x.in, &x.resp, x.method, IOBufSize, x)
}

// GrowReadBuffer is never asked for: the buffer is the largest already.
func (x *h2StreamExchange) GrowReadBuffer() {}

// InterimResponse drops a 1xx: the front end answered Expect itself.
func (x *h2StreamExchange) InterimResponse([]byte) error { return nil }

// ReadFailed prefers the body pump's error (exchange.HeadReadHooks).
func (x *h2StreamExchange) ReadFailed(err error) error { return exchange.PumpErrorOr(&x.pump, err) }

// startPump streams the request body to the upstream on a goroutine of
// its own, so that an upstream answering early is heard while the client
// still sends. A client waiting for 100 Continue is told to go on first.
func (x *h2StreamExchange) startPump() {
	st := x.st
	for _, hf := range st.Fields() {
		if hf.Name == "expect" && http1.EqualFold(stringBytes(hf.Value), "100-continue") {
			st.WriteHeaders(100, nil, false)
			break
		}
	}
	pump := make(chan error, 1)
	x.pump = pump
	up := x.up
	chunked := st.ContentLength() < 0
	idle := x.f.cc.settings.IdleTimeout
	go func() { pump <- pumpStreamBody(up, st, chunked, idle, &x.s.pumpBuf) }()
}

// stopPump ends a pump still running before the stream goes back to the
// engine: the stream is reset (a response complete before its request
// is, RFC 9113 §8.1) and the upstream connection's writes cut.
func (x *h2StreamExchange) stopPump() {
	if x.pump == nil {
		return
	}
	select {
	case <-x.pump:
	default:
		if x.headSent {
			x.st.CloseWrite() // the response is complete
		}
		x.st.Reset(http2.ErrCodeNo)
		if x.up != nil {
			x.up.SetDeadline(aLongTimeAgo)
		}
		<-x.pump
	}
	x.pump = nil
	if x.up != nil {
		x.up.Discard() // its request body is cut short
		x.up = nil
	}
}

// pumpStreamBody copies the stream's body to the upstream, chunked with
// the request trailers when it declared no length.
func pumpStreamBody(up *upstream.Conn, st *h2.Stream, chunked bool, idle time.Duration, trailerBuf *[]byte) (err error) {
	defer func() {
		if err != nil {
			// Wake the response reader: the exchange cannot complete.
			up.SetReadDeadline(time.Now())
		}
	}()
	buf := getBuf()
	defer putBuf(buf)
	var hdr []byte
	for {
		n, rerr := st.Read(buf)
		if n > 0 {
			up.SetWriteDeadline(time.Now().Add(idle))
			if chunked {
				hdr = http1.AppendChunkHeader(hdr[:0], n)
				bufs := net.Buffers{hdr, buf[:n], crlf}
				_, err = up.WriteBuffers(&bufs)
			} else {
				_, err = up.Write(buf[:n])
			}
			if err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			if chunked {
				// Request trailers are known once the body has ended.
				*trailerBuf = exchange.AppendHTTP1RequestTrailers((*trailerBuf)[:0], st.Trailers(), appendName)
				_, err = up.Write(http1.AppendLastChunk(hdr[:0], *trailerBuf))
			}
			return err
		}
		if rerr != nil {
			return errClientBody
		}
	}
}

// fail answers an exchange that failed before a response head went to
// the client, and settles the upstream connection.
func (x *h2StreamExchange) fail(err error, start time.Time) int {
	cc := x.f.cc
	status := 0
	switch {
	case errors.Is(err, errStreamReset):
		// Nothing to answer: the client is gone.
	case errors.Is(err, errClientBody):
		status = streamReply(x.st, x.s, cc.st, 400, "malformed or incomplete request body")
	default:
		var body string
		status, body = exchange.FailureStatus(err)
		if log := cc.l.Env.Log; log.IsDebug() {
			log.Debug("upstream request failed", "protocol", "HTTP/2.0", "status", status, "error", err)
		}
		status = streamReply(x.st, x.s, cc.st, status, body)
	}
	x.headSent = status != 0
	endpoint := -1
	if x.up != nil {
		endpoint = x.up.EndpointIndex()
	}
	x.stopPump() // the answer is out: the upload is cut
	if endpoint >= 0 {
		if !errors.Is(err, errClientBody) && !errors.Is(err, errStreamReset) {
			x.wc.ReportStatus(endpoint, 0)
		}
		if x.up != nil {
			x.up.Discard()
			x.up = nil
		}
		x.wc.RecordRequest(start, false)
	}
	return status
}

// forwardResponse writes the parsed response and its body to the stream
// and settles the upstream connection; false: the body was cut short
// after the head went out.
func (x *h2StreamExchange) forwardResponse() bool {
	resp := &x.resp
	s := x.s
	head := x.in.B[x.in.R : x.in.R+resp.HeadLen]
	x.in.R += resp.HeadLen
	bodyless := resp.Framing == http1.FramingNone
	s.fields, s.scratch = s.fields[:0], s.scratch[:0]
	for i := range resp.NFields {
		f := &resp.Fields[i]
		name := f.Name.Bytes(head)
		if f.Hop {
			if exchange.PassesRepresentationLength(name, resp.Status, bodyless) {
				s.fields = append(s.fields, hpack.HeaderField{Name: "content-length", Value: bytesString(f.Value.Bytes(head))})
			}
			continue
		}
		if isProxyAuth(name) {
			continue
		}
		s.fields = append(s.fields, hpack.HeaderField{Name: lowerName(&s.scratch, name), Value: bytesString(f.Value.Bytes(head))})
	}
	if resp.Framing == http1.FramingLength {
		n := len(s.scratch)
		s.scratch = appendInt(s.scratch, resp.ContentLength)
		s.fields = append(s.fields, hpack.HeaderField{Name: "content-length", Value: bytesString(s.scratch[n:])})
	}
	x.f.cc.st.Status(resp.Status)
	empty := bodyless || (resp.Framing == http1.FramingLength && resp.ContentLength == 0)
	x.headSent = true
	if err := x.st.WriteHeaders(resp.Status, s.fields, empty); err != nil {
		if x.pump == nil { // else stopPump settles it, once the pump is out
			x.up.Release(false)
			x.up = nil
		}
		return false
	}
	var err error
	upClean := !resp.Close
	switch resp.Framing {
	case http1.FramingLength:
		err = x.copyLength(resp.ContentLength)
	case http1.FramingChunked:
		err = x.copyChunked()
	case http1.FramingUntilClose:
		err = x.copyUntilClose()
		upClean = false
	}
	if err != nil || x.in.R != x.in.W {
		upClean = false
	}
	if x.pump != nil {
		select {
		case perr := <-x.pump:
			x.pump = nil
			if perr != nil {
				upClean = false
			}
		default:
			// The response is complete and the request body is
			// not: the connection cannot carry another request.
			upClean = false
		}
	}
	if x.pump == nil {
		x.up.Release(upClean)
		x.up = nil
	} // else stopPump settles it
	if last := x.last; last != nil && err == nil {
		// x.in.B is the exchange's own buffer, not the connection's.
		x.last = nil
		err = x.writeLast(last)
	}
	x.last = nil
	return err == nil
}

// ReadUpstream reads more of the response body (exchange.ReadMore, the
// one refill of both clients' body copiers; this buffer is already the
// size the head was read into, so it is only compacted).
func (x *h2StreamExchange) ReadUpstream() error {
	if !x.flushed {
		// Nothing the upstream has sent waits in the proxy while it
		// waits for more.
		x.st.Flush()
		x.flushed = true
	}
	return exchange.ReadMore(x.up, &x.in, len(x.in.B), x, &x.bodyDeadline, x.f.cc.settings.IdleTimeout)
}

func (x *h2StreamExchange) write(p []byte) error {
	n, err := x.st.Write(p)
	x.sent += int64(n)
	x.flushed = false
	return err
}

// writeLast is write for the last bytes of a response (h2.Stream.WriteLast).
func (x *h2StreamExchange) writeLast(p []byte) error {
	n, err := x.st.WriteLast(p)
	x.sent += int64(n)
	x.flushed = false
	return err
}

// WriteBody writes a piece of the response body as DATA
// (exchange.BodySink). The last piece of a body with a length is kept
// for the frame that ends the stream, which forwardResponse writes once
// the upstream connection is back in its pool (x.last).
func (x *h2StreamExchange) WriteBody(p []byte, last bool) error {
	if last {
		x.last = p
		return nil
	}
	return x.write(p)
}

func (x *h2StreamExchange) copyLength(n int64) error {
	x.bodyDeadline = time.Time{}
	x.flushed = true
	return exchange.CopyLength(&x.in, n, x)
}

func (x *h2StreamExchange) copyChunked() error {
	x.bodyDeadline = time.Time{}
	x.flushed = true
	return exchange.CopyChunked(&x.in, &x.chunks, x)
}

// Chunk sends a chunk's data as DATA, and the last chunk's trailer
// fields as HTTP/2 trailers (exchange.ChunkSink).
func (x *h2StreamExchange) Chunk(data, trailer []byte, done bool) error {
	if len(data) > 0 {
		if err := x.write(data); err != nil {
			return err
		}
	}
	if done {
		return x.writeTrailers(trailer)
	}
	return nil
}

// FlushChunks: the stream's frames are flushed by ReadUpstream before it
// waits (exchange.ChunkSink).
func (x *h2StreamExchange) FlushChunks() error { return nil }

// writeTrailers sends a chunked body's trailer fields (validated by the
// decoder) as HTTP/2 trailers: gRPC-over-HTTP/1.1 bridges and others put
// a status there.
func (x *h2StreamExchange) writeTrailers(trailer []byte) error {
	s := x.s
	s.fields, s.scratch = s.fields[:0], s.scratch[:0]
	for len(trailer) > 0 {
		line := trailer
		if i := bytes.Index(trailer, crlf); i >= 0 {
			line, trailer = trailer[:i], trailer[i+2:]
		} else {
			trailer = nil
		}
		i := bytes.IndexByte(line, ':')
		if i <= 0 {
			continue
		}
		s.fields = append(s.fields, hpack.HeaderField{Name: lowerName(&s.scratch, line[:i]), Value: bytesString(bytes.Trim(line[i+1:], " \t"))})
	}
	if len(s.fields) == 0 {
		return nil
	}
	return x.st.WriteTrailers(s.fields)
}

func (x *h2StreamExchange) copyUntilClose() error {
	x.bodyDeadline = time.Time{}
	x.flushed = true
	return exchange.CopyUntilClose(&x.in, x)
}

// appendName writes a field name as HTTP/2 carried it (lower case): to
// an HTTP/1.1 upstream, which matches names without case.
func appendName(b []byte, name string) []byte { return append(b, name...) }
