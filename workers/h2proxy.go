package workers

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/hotproxy/hotproxy/upstream"
	"github.com/hotproxy/hotproxy/workers/http1"
)

// An HTTP/2 request proxied to an HTTP/1.1 upstream: the request head is
// written with the HTTP/1.1 codec's rules (h1proxy.go's, from an
// http.Request instead of a parsed head), sent on a connection of the
// worker's pool, and the response head parsed in place (workers/http1)
// and handed to the HTTP/2 server.

// h2Exchange is one such request's state.
type h2Exchange struct {
	h          *h2Handler
	r          *http.Request
	wc         *upstream.WorkerCluster
	up         *upstream.Conn
	resp       http1.Response
	chunks     http1.ChunkedDecoder
	hasBody    bool // a body streams from the client (never resent)
	idempotent bool
	method     []byte // for the response's framing (HEAD)
	// The upstream's read buffer and its unconsumed bytes.
	ub     []byte
	ur, uw int
	// pump reports the request body's end; nil while none runs.
	pump    chan error
	retries int
	sent    int64 // body bytes written to the client
}

func (h *h2Handler) proxyHTTP1(w http.ResponseWriter, r *http.Request, lv *listenerView, rt *route, wc *upstream.WorkerCluster, hr *h2Request, start time.Time, res *h2Result) {
	x := &h2Exchange{h: h, r: r, wc: wc, method: methodOther}
	x.hasBody = r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
	switch r.Method {
	case "HEAD":
		x.method, x.idempotent = methodHEAD, true
	case "GET", "OPTIONS", "TRACE", "PUT", "DELETE":
		x.idempotent = true
	}
	hr.head = h.cc.appendH2UpstreamHead(hr.head[:0], r, wc.Name(), x.hasBody)
	defer func() {
		if x.ub != nil {
			putBuf(x.ub)
			x.ub = nil
		}
	}()
	err := x.tryUntilResponse(lv, rt, hr.head, start)
	if x.up != nil {
		res.upAddr = x.up.Endpoint()
	}
	res.retries = x.retries
	if err == nil && x.hasBody {
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
		res.status = x.fail(w, err, start)
		return
	}
	wc.RecordRequest(start, true)
	wc.ReportStatus(x.up.EndpointIndex(), x.resp.Status)
	res.status = x.resp.Status
	ok := x.forwardResponse(w)
	res.sent = x.sent
	if !ok {
		// The response is cut short after its head went out: the
		// stream is reset, so that the client does not take it for
		// a complete response.
		panic(http.ErrAbortHandler)
	}
}

// appendH2UpstreamHead writes the HTTP/1.1 request head for r: Host from
// :authority, the hop-by-hop fields HTTP/2 forbids left out (x/net
// already refuses requests that carry them), X-Forwarded-* and
// X-Request-Id as HTTP/1.1 requests get them, and framing of the proxy's
// own: Content-Length when the client declared it, otherwise chunked.
func (cc *clientConn) appendH2UpstreamHead(b []byte, r *http.Request, upstreamHost string, hasBody bool) []byte {
	b = append(b, r.Method...)
	b = append(b, ' ')
	b = append(b, r.RequestURI...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	if r.Host != "" {
		b = append(b, r.Host...)
	} else {
		b = append(b, upstreamHost...)
	}
	b = append(b, "\r\n"...)
	hasID := false
	for name, values := range r.Header {
		switch name {
		case "Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "Te",
			"Trailer", "Host", "Content-Length", "Proxy-Authorization", "Proxy-Authenticate",
			"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto":
			continue
		case "X-Request-Id":
			hasID = true
		}
		for _, v := range values {
			b = append(b, name...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	b = append(b, "X-Forwarded-For: "...)
	if cc.cfg.trustXFF {
		for _, v := range r.Header["X-Forwarded-For"] {
			if v != "" {
				b = append(b, v...)
				b = append(b, ", "...)
			}
		}
	}
	b = append(b, cc.clientIP...)
	if r.TLS != nil {
		b = append(b, "\r\nX-Forwarded-Proto: https\r\n"...)
	} else {
		b = append(b, "\r\nX-Forwarded-Proto: http\r\n"...)
	}
	if r.Host != "" {
		b = append(b, "X-Forwarded-Host: "...)
		b = append(b, r.Host...)
		b = append(b, "\r\n"...)
	}
	if !hasID {
		b = append(b, "X-Request-Id: "...)
		b = appendRequestID(b)
		b = append(b, "\r\n"...)
	}
	switch {
	case hasBody && r.ContentLength > 0:
		b = append(b, "Content-Length: "...)
		b = appendInt(b, r.ContentLength)
		b = append(b, "\r\n"...)
	case hasBody:
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	case r.Method == "POST" || r.Method == "PUT" || r.Method == "PATCH":
		// An empty body said so: some servers wait for a body of a
		// POST that gives no length.
		b = append(b, "Content-Length: 0\r\n"...)
	}
	return append(b, "\r\n"...)
}

// tryUntilResponse is h1retry.go's loop for an HTTP/2 request: it sends
// the head and, for a request without a body, reads the response head,
// trying again where the route's retry policy says so, or once on a
// stale pooled connection. A request whose body streams from the client
// is tried once (but a connect failure, where nothing was sent).
func (x *h2Exchange) tryUntilResponse(lv *listenerView, rt *route, head []byte, start time.Time) error {
	cc := x.h.cc
	ctx := x.r.Context()
	timeout := rt.timeout
	if timeout == 0 {
		timeout = lv.requestTimeout
	}
	deadline := start.Add(timeout)
	pol := &rt.retry
	left := 0
	if !x.hasBody {
		left = pol.num
	}
	key := h2HashKey(&rt.hashOn, x.r, cc.clientIP)
	prev, stale, staleRetried := -1, false, false
	var err error
	for attempt := 0; ; attempt++ {
		switch {
		case attempt == 0:
			x.up, err = x.wc.AcquireKey(ctx, key, !(x.idempotent && !x.hasBody))
		case stale:
			x.up, err = x.wc.AcquireFresh(ctx, prev)
		default:
			x.up, err = x.wc.AcquireRetry(ctx, key, prev)
		}
		if err != nil {
			x.up = nil
			var ce *upstream.ConnectError
			if left > 0 && pol.on&retryConnectFailure != 0 && errors.As(err, &ce) && time.Now().Before(deadline) {
				left--
				x.countRetry()
				prev, stale = -1, false
				continue
			}
			return err
		}
		tryDeadline := deadline
		if pol.perTry > 0 {
			tryDeadline = minTime(deadline, time.Now().Add(pol.perTry))
		}
		x.up.SetDeadline(tryDeadline)
		_, err = x.up.Write(head)
		if err == nil && !x.hasBody {
			err = x.readResponseHead()
		}
		prev, stale = x.up.EndpointIndex(), false
		switch {
		case err != nil && !staleRetried && attempt == 0 && x.retryable(err):
			staleRetried, stale = true, true
			x.retries++
		case err != nil:
			if left == 0 || !(x.idempotent || pol.nonIdempotent) || !retryOnError(pol.on, err) || !time.Now().Before(deadline) {
				return err
			}
			x.wc.ReportStatus(prev, 0)
			left--
			x.countRetry()
		case !x.hasBody && left > 0 && retryOnStatus(pol.on, x.resp.Status) &&
			(x.idempotent || pol.nonIdempotent) && time.Now().Before(deadline):
			x.wc.ReportStatus(prev, x.resp.Status)
			left--
			x.countRetry()
		default:
			if left < pol.num && !x.hasBody && err == nil && !retryOnStatus(pol.on, x.resp.Status) {
				x.wc.CountRetrySuccess()
			}
			if pol.perTry > 0 {
				x.up.SetDeadline(deadline)
			}
			return nil
		}
		x.up.Discard()
		x.up = nil
		x.ur, x.uw = 0, 0
	}
}

func (x *h2Exchange) countRetry() {
	x.retries++
	x.wc.CountRetry()
}

// retryable: as h1retry.go's, a safe request without a body that met a
// pooled connection the upstream had closed goes once more on a fresh one.
func (x *h2Exchange) retryable(err error) bool {
	if !x.up.Reused() || x.hasBody || x.uw > 0 || isTimeout(err) || !x.idempotent {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrUnexpectedEOF)
}

// h2HashKey is hashKey (h1retry.go) for an HTTP/2 request.
func h2HashKey(h *hashSource, r *http.Request, clientIP []byte) uint64 {
	switch h.kind {
	case hashSourceIP:
		return upstream.HashKey(clientIP)
	case hashHeader:
		if v := r.Header.Get(h.name); v != "" {
			return upstream.HashKey([]byte(v))
		}
	case hashCookie:
		for _, c := range r.Header["Cookie"] {
			if v, ok := cookieValue([]byte(c), h.name); ok {
				return upstream.HashKey(v)
			}
		}
	}
	return 0
}

// readResponseHead reads until x.resp holds the final response head;
// interim responses (100 Continue, 103) are dropped: x/net answers Expect
// itself, when the handler first reads the body.
func (x *h2Exchange) readResponseHead() error {
	if x.ub == nil {
		x.ub = getBuf()
	}
	parse := x.ur < x.uw
	for {
		err := http1.ErrIncomplete
		if parse {
			err = x.resp.Parse(x.ub[x.ur:x.uw], http1.Limits{MaxHeadBytes: ioBufSize}, x.method)
		}
		if err == http1.ErrIncomplete {
			if x.uw == len(x.ub) {
				if x.ur == 0 {
					return &http1.Error{Status: 502, Reason: "upstream response head too large"}
				}
				x.uw = copy(x.ub, x.ub[x.ur:x.uw])
				x.ur = 0
			}
			n, err := x.up.Read(x.ub[x.uw:])
			x.uw += n
			if n == 0 {
				if err == nil {
					err = io.ErrNoProgress
				}
				return x.pumpErrorOr(err)
			}
			parse = bytes.IndexByte(x.ub[x.uw-n:x.uw], '\n') >= 0 || x.uw == len(x.ub)
			continue
		}
		if err != nil {
			return err
		}
		if x.resp.Status >= 200 || x.resp.Status == 101 {
			return nil
		}
		x.ur += x.resp.HeadLen
		parse = x.ur < x.uw
	}
}

// pumpErrorOr prefers the body pump's error (the client's) to the
// upstream read error it caused.
func (x *h2Exchange) pumpErrorOr(err error) error {
	if x.pump == nil {
		return err
	}
	select {
	case perr := <-x.pump:
		x.pump = nil
		if perr != nil {
			return perr
		}
	default:
	}
	return err
}

// startPump streams the request body to the upstream on a goroutine of
// its own, so that an upstream answering early is heard while the client
// still sends. It touches only the request body, the upstream connection
// and its own buffer: it may outlive the handler (an early response, the
// body still coming), and ends when the HTTP/2 server closes the body.
func (x *h2Exchange) startPump() {
	pump := make(chan error, 1)
	x.pump = pump
	up, body, trailer := x.up, x.r.Body, x.r.Trailer
	chunked := x.r.ContentLength < 0
	idle := x.h.cc.cfg.idleTimeout
	go func() { pump <- pumpH2Body(up, body, trailer, chunked, idle) }()
}

func pumpH2Body(up *upstream.Conn, body io.Reader, trailer http.Header, chunked bool, idle time.Duration) (err error) {
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
		n, rerr := body.Read(buf)
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
				_, err = up.Write(http1.AppendLastChunk(hdr[:0], appendTrailer(nil, trailer)))
			}
			return err
		}
		if rerr != nil {
			return errClientBody
		}
	}
}

var crlf = []byte("\r\n")

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

// fail answers an exchange that failed before a response head went to
// the client, and settles the upstream connection.
func (x *h2Exchange) fail(w http.ResponseWriter, err error, start time.Time) int {
	st := x.h.cc.st
	if x.up != nil {
		if !errors.Is(err, errClientBody) && !errors.Is(err, context.Canceled) {
			x.wc.ReportStatus(x.up.EndpointIndex(), 0)
		}
		x.up.Discard()
		x.wc.RecordRequest(start, false)
	}
	if errors.Is(err, errClientBody) {
		return h2Answer(w, st, http.StatusBadRequest, "malformed or incomplete request body")
	}
	status, body := classify(err)
	if log := x.h.cc.m.log; log.IsDebug() {
		log.Debug("upstream request failed", "protocol", "HTTP/2.0", "status", status, "error", err)
	}
	return h2Answer(w, st, status, body)
}

// forwardResponse hands the parsed response and its body to the HTTP/2
// server and settles the upstream connection; false: the body was cut
// short after the head went out.
func (x *h2Exchange) forwardResponse(w http.ResponseWriter) bool {
	resp := &x.resp
	head := x.ub[x.ur : x.ur+resp.HeadLen]
	x.ur += resp.HeadLen
	hd := w.Header()
	bodyless := resp.Framing == http1.FramingNone
	for i := range resp.NFields {
		f := &resp.Fields[i]
		name := f.Name.Bytes(head)
		if f.Hop {
			// A HEAD or 304 response's Content-Length describes the
			// representation: it passes.
			if bodyless && resp.Status != 204 && http1.EqualFold(name, "content-length") {
				hd["Content-Length"] = []string{string(f.Value.Bytes(head))}
			}
			continue
		}
		if isProxyAuth(name) {
			continue
		}
		k := http.CanonicalHeaderKey(string(name))
		hd[k] = append(hd[k], string(f.Value.Bytes(head)))
	}
	if resp.Framing == http1.FramingLength {
		hd["Content-Length"] = []string{string(appendInt(nil, resp.ContentLength))}
	}
	x.h.cc.st.status(resp.Status)
	w.WriteHeader(resp.Status)

	var err error
	upClean := !resp.Close
	switch resp.Framing {
	case http1.FramingLength:
		err = x.copyLength(w, resp.ContentLength)
	case http1.FramingChunked:
		err = x.copyChunked(w)
	case http1.FramingUntilClose:
		err = x.copyUntilClose(w)
		upClean = false
	}
	if err != nil || x.ur != x.uw {
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
	x.up.Release(upClean)
	return err == nil
}

// readUpstream reads more of the response body into ub.
func (x *h2Exchange) readUpstream(deadline *time.Time) error {
	if x.ur == x.uw {
		x.ur, x.uw = 0, 0
	} else if x.uw == len(x.ub) {
		x.uw = copy(x.ub, x.ub[x.ur:x.uw])
		x.ur = 0
	}
	d := x.h.cc.cfg.idleTimeout
	if now := time.Now(); deadline.IsZero() || now.Add(d).Sub(*deadline) > deadlineSlack {
		*deadline = now.Add(d)
		x.up.SetReadDeadline(*deadline)
	}
	n, err := x.up.Read(x.ub[x.uw:])
	x.uw += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// write sends body bytes to the client and, with flush, sends them on:
// the proxy holds nothing back that the upstream has sent.
func (x *h2Exchange) write(w http.ResponseWriter, p []byte, flush bool) error {
	n, err := w.Write(p)
	x.sent += int64(n)
	if err != nil {
		return err
	}
	if f, ok := w.(http.Flusher); ok && flush {
		f.Flush()
	}
	return nil
}

func (x *h2Exchange) copyLength(w http.ResponseWriter, n int64) error {
	var deadline time.Time
	for n > 0 {
		if x.ur == x.uw {
			if err := x.readUpstream(&deadline); err != nil {
				return err
			}
		}
		k := min(n, int64(x.uw-x.ur))
		// The last bytes are not flushed: the handler's end sends them
		// in the frame that ends the stream.
		if err := x.write(w, x.ub[x.ur:x.ur+int(k)], k < n); err != nil {
			return err
		}
		x.ur += int(k)
		n -= k
	}
	return nil
}

func (x *h2Exchange) copyChunked(w http.ResponseWriter) error {
	d := &x.chunks
	d.Reset()
	var deadline time.Time
	for {
		for x.ur < x.uw {
			n, data, trailer, done, err := d.Next(x.ub[x.ur:x.uw])
			if err != nil {
				return &http1.Error{Status: 502, Reason: "upstream sent a malformed chunked body"}
			}
			if n == 0 {
				break
			}
			if len(data) > 0 {
				if _, err := w.Write(data); err != nil {
					return err
				}
				x.sent += int64(len(data))
			}
			if done {
				setTrailers(w.Header(), trailer)
				x.ur += n
				return nil
			}
			x.ur += n
		}
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		if err := x.readUpstream(&deadline); err != nil {
			return err
		}
	}
}

// setTrailers sends a chunked body's trailer fields (validated by the
// decoder) as HTTP/2 trailers.
func setTrailers(hd http.Header, trailer []byte) {
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
		name := http.CanonicalHeaderKey(string(line[:i]))
		hd[http.TrailerPrefix+name] = append(hd[http.TrailerPrefix+name], string(bytes.Trim(line[i+1:], " \t")))
	}
}

func (x *h2Exchange) copyUntilClose(w http.ResponseWriter) error {
	var deadline time.Time
	for {
		if x.ur < x.uw {
			if err := x.write(w, x.ub[x.ur:x.uw], true); err != nil {
				return err
			}
			x.ur = x.uw
		}
		if err := x.readUpstream(&deadline); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}
