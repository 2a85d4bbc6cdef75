package workers

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hotproxy/hotproxy/upstream"
	"github.com/hotproxy/hotproxy/workers/http1"
)

// errClientBody marks an exchange cut because the client's request body
// was malformed, cut short or too slow: the client is answered 400 (if
// nothing was sent yet) and its connection closed; never a 5xx that blames
// the upstream, never another request parsed from that connection.
var errClientBody = errors.New("malformed or incomplete request body")

// errPumpStopped: the exchange ended before the request body did, and the
// body pump was told to stop.
var errPumpStopped = errors.New("request body no longer needed")

// exchange is one proxied request's state on the stack of its connection's
// goroutine.
type exchange struct {
	cc    *clientConn
	wc    *upstream.WorkerCluster
	up    *upstream.Conn
	head  []byte // the client's request head (in rbuf): valid only until the body pump starts refilling rbuf
	start time.Time
	// method is what the response parser needs of the request's method,
	// kept apart from head, which the body pump may overwrite.
	method     []byte
	idempotent bool // the request may be sent twice (RFC 9110 §9.2.2)

	// The request body still to come from the client after the head
	// write; bodyLeft < 0 for chunked.
	bodyDone bool
	bodyLeft int64
	pump     chan error // the body pump's result, while one runs
	stop     atomic.Bool

	// The upstream's read buffer and its unconsumed bytes.
	ub     []byte
	ur, uw int

	// interim: a 1xx response went to the client (in wbuf, where the
	// request for a retry was): the request is not sent again.
	interim bool
	retries int // retries made (retry_on and a stale connection)
}

// proxy forwards the request to rt's cluster and the response back. It
// reports whether the client connection may carry another request.
func (cc *clientConn) proxy(lv *listenerView, rt *route, start time.Time, keep bool) bool {
	ex := cc.ex
	req := &ex.req
	// The exchange lives in the pooled state: it would escape to the heap
	// on every request (the body pump refers to it).
	x := &ex.xchg
	*x = exchange{cc: cc, wc: lv.clusters[rt.index], start: start}
	x.head = cc.rbuf[cc.r : cc.r+req.HeadLen]
	x.method = methodOther
	switch string(req.Method.Bytes(x.head)) {
	case "HEAD":
		x.method, x.idempotent = methodHEAD, true
	case "GET", "OPTIONS", "TRACE", "PUT", "DELETE":
		x.idempotent = true
	}

	// The request head for the upstream, and as much of the body as is
	// buffered, go out in one write.
	b := cc.appendUpstreamHead(ex.wbuf[:0], x.head, x.wc.Name())
	cc.r += req.HeadLen
	var err error
	var bodyRef []byte // body bytes sent as they are, after b
	b, bodyRef, err = x.takeBufferedBody(b)
	ex.wbuf = b
	if err != nil {
		return cc.failBeforeResponse(x, err)
	}

	err = x.tryUntilResponse(lv, rt, b, bodyRef)
	if x.up != nil {
		cc.upAddr = x.up.Endpoint()
	}
	cc.retries = x.retries
	if err == nil && !x.bodyDone {
		x.startPump()
		err = x.readResponseHead()
	}
	if err != nil {
		return cc.failBeforeResponse(x, err)
	}
	x.wc.RecordRequest(start, true)
	// Hook (upstream resilience): the outcome feeds outlier detection
	// and the per-endpoint counters; atomics only.
	x.wc.ReportStatus(x.up.EndpointIndex(), int(cc.ex.resp.Status))
	return x.forwardResponse(keep)
}

// tryUntilResponse sends the request (head b, then bodyRef) and, when its
// body is complete, reads the response head; it sends it again where the
// route's retry policy says so (or once on a stale pooled connection), to
// another endpoint where there is one. On return, x.up is the connection
// of the last try (nil if none connected) and, on success with
// x.bodyDone, cc.ex.resp its response head. A try is repeated only while
// the whole request is in b and bodyRef (x.bodyDone: nothing streams from
// the client) and nothing of a response reached the client; a response
// it repeats is read no further and its connection closed.
func (x *exchange) tryUntilResponse(lv *listenerView, rt *route, b, bodyRef []byte) error {
	cc := x.cc
	timeout := rt.timeout
	if timeout == 0 {
		timeout = lv.requestTimeout
	}
	deadline := x.start.Add(timeout)
	pol := &rt.retry
	left := 0
	if x.bodyDone {
		left = pol.num
	}
	key := cc.hashKey(&rt.hashOn, x.head)
	prev, stale := -1, false
	staleRetried := false
	var err error
	for attempt := 0; ; attempt++ {
		switch {
		case attempt == 0:
			// A stale pooled connection is caught by the retry below,
			// for a request that can be sent twice; any other takes a
			// checked one.
			x.up, err = x.wc.AcquireKey(cc.m.ctx, key, !(x.idempotent && x.bodyDone))
		case stale:
			x.up, err = x.wc.AcquireFresh(cc.m.ctx, prev)
		default:
			x.up, err = x.wc.AcquireRetry(cc.m.ctx, key, prev)
		}
		if err != nil {
			x.up = nil
			var ce *upstream.ConnectError
			if left > 0 && pol.on&retryConnectFailure != 0 && errors.As(err, &ce) && time.Now().Before(deadline) {
				// Nothing was sent: safe whatever the method.
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
		err = x.sendHead(b, bodyRef)
		if err == nil && x.bodyDone {
			// The response head may already be there; a stale pooled
			// connection shows itself now, as EOF or a reset.
			err = x.readResponseHead()
		}
		prev, stale = x.up.EndpointIndex(), false
		switch {
		case err != nil && !staleRetried && attempt == 0 && x.retryable(err):
			staleRetried, stale = true, true
			x.retries++
		case err != nil:
			if left == 0 || x.interim || !x.mayResend(pol) || !retryOnError(pol.on, err) || !time.Now().Before(deadline) {
				return err
			}
			// Hook (upstream resilience): the failed try counts for
			// outlier detection.
			x.wc.ReportStatus(prev, 0)
			left--
			x.countRetry()
		case x.bodyDone && left > 0 && !x.interim && retryOnStatus(pol.on, int(cc.ex.resp.Status)) &&
			x.mayResend(pol) && time.Now().Before(deadline):
			// A response to repeat: never sent to the client, its
			// connection closed rather than its body read.
			x.wc.ReportStatus(prev, int(cc.ex.resp.Status))
			left--
			x.countRetry()
		default:
			if left < pol.num && x.bodyDone && err == nil && !retryOnStatus(pol.on, int(cc.ex.resp.Status)) {
				x.wc.CountRetrySuccess()
			}
			if !x.bodyDone || err != nil || pol.perTry == 0 {
				return err
			}
			// The body is read within the request deadline, no longer
			// the try's.
			x.up.SetDeadline(deadline)
			return nil
		}
		x.up.Discard()
		x.up = nil
		x.ur, x.uw = 0, 0
	}
}

func (x *exchange) countRetry() {
	x.retries++
	x.wc.CountRetry()
}

// mayResend: the request's bytes reached the upstream, which may have
// acted on them; only an idempotent request is sent again, unless the
// route says retry_non_idempotent.
func (x *exchange) mayResend(pol *retryPolicy) bool {
	return x.idempotent || pol.nonIdempotent
}

// retryOnError reports whether a try that failed after its request was
// sent (no response head, a timeout, a malformed response) is retried.
func retryOnError(on retryOn, err error) bool {
	if errors.Is(err, errClientBody) || errors.Is(err, context.Canceled) {
		return false
	}
	var pe *http1.Error
	switch {
	case isTimeout(err):
		// per_try_timeout (the request's own deadline is checked
		// apart).
		return on&(retryReset|retry5xx|retryGatewayError) != 0
	case errors.As(err, &pe):
		return on&retry5xx != 0
	}
	return on&(retryReset|retry5xx) != 0
}

// retryOnStatus reports whether a response with status is retried.
func retryOnStatus(on retryOn, status int) bool {
	switch {
	case status < 500:
		return false
	case on&retry5xx != 0:
		return true
	}
	return on&retryGatewayError != 0 && (status == 502 || status == 503 || status == 504)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// hashKey finds the request's hash_on key (upstream.HashKey; 0: the
// request has none) without allocating.
func (cc *clientConn) hashKey(h *hashSource, head []byte) uint64 {
	req := &cc.ex.req
	switch h.kind {
	case hashSourceIP:
		return upstream.HashKey(cc.clientIP)
	case hashHeader:
		for i := range req.NFields {
			f := &req.Fields[i]
			if http1.EqualFold(f.Name.Bytes(head), h.name) {
				return upstream.HashKey(f.Value.Bytes(head))
			}
		}
	case hashCookie:
		for i := range req.NFields {
			f := &req.Fields[i]
			if !http1.EqualFold(f.Name.Bytes(head), "cookie") {
				continue
			}
			if v, ok := cookieValue(f.Value.Bytes(head), h.name); ok {
				return upstream.HashKey(v)
			}
		}
	}
	return 0
}

// cookieValue returns the value of cookie name in a Cookie header's value
// ("a=1; session=xyz"), without allocating.
func cookieValue(header []byte, name string) ([]byte, bool) {
	for len(header) > 0 {
		pair := header
		if i := bytes.IndexByte(header, ';'); i >= 0 {
			pair, header = header[:i], header[i+1:]
		} else {
			header = nil
		}
		pair = bytes.TrimLeft(pair, " \t")
		if len(pair) > len(name) && pair[len(name)] == '=' && string(pair[:len(name)]) == name {
			return bytes.TrimRight(pair[len(name)+1:], " \t"), true
		}
	}
	return nil, false
}

// Methods as the response parser sees them: only HEAD changes a
// response's framing (CONNECT is refused before it gets here).
var (
	methodHEAD  = []byte("HEAD")
	methodOther = []byte("GET")
)

// retryable: a request that met a stale pooled connection (closed by the
// upstream while idle) is sent once more on a fresh one, when nothing of a
// response came back, the whole body went with the head, and repeating the
// request is safe.
func (x *exchange) retryable(err error) bool {
	if !x.up.Reused() || !x.bodyDone || x.uw > 0 || isTimeout(err) || errors.Is(err, errClientBody) {
		return false
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return false
	}
	return x.idempotent
}

// appendUpstreamHead writes the request head as the upstream gets it:
// hop-by-hop fields removed, X-Forwarded-* and X-Request-Id set, framing
// of the proxy's own.
func (cc *clientConn) appendUpstreamHead(b, head []byte, upstreamHost string) []byte {
	req := &cc.ex.req
	b = append(b, req.Method.Bytes(head)...)
	b = append(b, ' ')
	b = append(b, req.Target.Bytes(head)...)
	b = append(b, " HTTP/1.1\r\n"...)
	// Host goes first and always: a Connection header that names it (the
	// RFC makes it hop-by-hop then) must not strip it, and an HTTP/1.0
	// request without one still gets one (the cluster's name).
	b = append(b, "Host: "...)
	if req.Host.Len() > 0 {
		b = append(b, req.Host.Bytes(head)...)
	} else {
		b = append(b, upstreamHost...)
	}
	b = append(b, "\r\n"...)
	hasID := false
	for i := range req.NFields {
		f := &req.Fields[i]
		if f.Hop {
			continue
		}
		name := f.Name.Bytes(head)
		if len(name) == 4 && http1.EqualFold(name, "host") {
			continue
		}
		if isProxyAuth(name) {
			continue // meant for this hop: the client's credentials for a proxy
		}
		if len(name) > 2 && (name[0]|0x20) == 'x' && name[1] == '-' {
			switch {
			case http1.EqualFold(name, "x-forwarded-for"),
				http1.EqualFold(name, "x-forwarded-host"),
				http1.EqualFold(name, "x-forwarded-proto"):
				continue // set below
			case http1.EqualFold(name, "x-request-id"):
				hasID = true
			}
		}
		b = append(b, name...)
		b = append(b, ": "...)
		b = append(b, f.Value.Bytes(head)...)
		b = append(b, "\r\n"...)
	}
	b = append(b, "X-Forwarded-For: "...)
	if cc.cfg.trustXFF {
		for i := range req.NFields {
			f := &req.Fields[i]
			if http1.EqualFold(f.Name.Bytes(head), "x-forwarded-for") && f.Value.Len() > 0 {
				b = append(b, f.Value.Bytes(head)...)
				b = append(b, ", "...)
			}
		}
	}
	b = append(b, cc.clientIP...)
	b = append(b, "\r\nX-Forwarded-Proto: http\r\n"...)
	if req.Host.Len() > 0 {
		b = append(b, "X-Forwarded-Host: "...)
		b = append(b, req.Host.Bytes(head)...)
		b = append(b, "\r\n"...)
	}
	if !hasID {
		b = append(b, "X-Request-Id: "...)
		b = appendRequestID(b)
		b = append(b, "\r\n"...)
	}
	if req.Upgrade.Len() > 0 {
		b = append(b, "Connection: upgrade\r\nUpgrade: "...)
		b = append(b, req.Upgrade.Bytes(head)...)
		b = append(b, "\r\n"...)
	}
	switch req.Framing {
	case http1.FramingLength:
		b = append(b, "Content-Length: "...)
		b = appendInt(b, req.ContentLength)
		b = append(b, "\r\n"...)
	case http1.FramingChunked:
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	return append(b, "\r\n"...)
}

// isProxyAuth: Proxy-Authorization and Proxy-Authenticate concern one hop
// and are never forwarded.
func isProxyAuth(name []byte) bool {
	return len(name) > 6 && (name[0]|0x20) == 'p' &&
		(http1.EqualFold(name, "proxy-authorization") || http1.EqualFold(name, "proxy-authenticate"))
}

// inlineBodyMax: a Content-Length body up to this size that is already
// buffered is copied behind the head, so both go in one write.
const inlineBodyMax = 8 << 10

// takeBufferedBody moves the body bytes already read from the client to
// the upstream request: appended to b (small, or re-encoded chunks), or as
// bodyRef, a slice of rbuf written right after b. It sets bodyDone, or
// what is left for the pump.
func (x *exchange) takeBufferedBody(b []byte) (_ []byte, bodyRef []byte, err error) {
	cc := x.cc
	req := &cc.ex.req
	switch req.Framing {
	case http1.FramingNone:
		x.bodyDone = true
	case http1.FramingLength:
		n := min(req.ContentLength, int64(cc.w-cc.r))
		if n <= inlineBodyMax {
			b = append(b, cc.rbuf[cc.r:cc.r+int(n)]...)
		} else {
			bodyRef = cc.rbuf[cc.r : cc.r+int(n)]
		}
		cc.r += int(n)
		x.bodyLeft = req.ContentLength - n
		x.bodyDone = x.bodyLeft == 0
	case http1.FramingChunked:
		d := &cc.ex.reqChunks
		d.Reset()
		x.bodyLeft = -1
		for cc.r < cc.w {
			n, data, trailer, done, err := d.Next(cc.rbuf[cc.r:cc.w])
			if err != nil {
				return b, nil, errClientBody
			}
			if n == 0 {
				break
			}
			cc.r += n
			b = appendChunk(b, data, trailer, done)
			if done {
				x.bodyDone = true
				break
			}
		}
	}
	return b, bodyRef, nil
}

// appendChunk re-encodes decoded chunked data: sizes are the proxy's own,
// never the client's.
func appendChunk(b, data, trailer []byte, done bool) []byte {
	if len(data) > 0 {
		b = http1.AppendChunkHeader(b, len(data))
		b = append(b, data...)
		b = append(b, "\r\n"...)
	}
	if done {
		b = http1.AppendLastChunk(b, trailer)
	}
	return b
}

// sendHead writes the request head (and the body bytes taken with it).
func (x *exchange) sendHead(b, bodyRef []byte) error {
	if len(bodyRef) == 0 {
		_, err := x.up.Write(b)
		return err
	}
	bufs := net.Buffers{b, bodyRef}
	_, err := bufs.WriteTo(x.up.TCPConn)
	return err
}

// startPump streams the rest of the request body to the upstream on its
// own goroutine, so that an upstream answering early (401, 413) is heard
// while the client still sends. The pump owns rbuf until it reports.
func (x *exchange) startPump() {
	x.pump = make(chan error, 1)
	go func() { x.pump <- x.pumpBody() }()
}

func (x *exchange) pumpBody() (err error) {
	cc := x.cc
	defer func() {
		if err != nil {
			// Wake the response reader: the exchange cannot complete.
			x.up.SetReadDeadline(time.Now())
		}
	}()
	var out []byte
	if x.bodyLeft < 0 {
		out = getBuf()[:0]
		defer func() { putBuf(out) }()
	}
	upDeadline := time.Time{}
	writeUp := func(p []byte) error {
		if now := time.Now(); upDeadline.IsZero() || now.Sub(upDeadline) > -cc.cfg.idleTimeout+deadlineSlack {
			upDeadline = now.Add(cc.cfg.idleTimeout)
			x.up.SetWriteDeadline(upDeadline)
		}
		_, err := x.up.Write(p)
		return err
	}
	for {
		if x.bodyLeft == 0 {
			return nil
		}
		if x.bodyLeft > 0 && cc.r < cc.w {
			n := min(x.bodyLeft, int64(cc.w-cc.r))
			if err := writeUp(cc.rbuf[cc.r : cc.r+int(n)]); err != nil {
				return err
			}
			cc.r += int(n)
			x.bodyLeft -= n
			continue
		}
		if x.bodyLeft < 0 {
			d := &cc.ex.reqChunks
			for cc.r < cc.w {
				n, data, trailer, done, err := d.Next(cc.rbuf[cc.r:cc.w])
				if err != nil {
					return errClientBody
				}
				if n == 0 {
					break
				}
				cc.r += n
				if len(out)+len(data)+32 > cap(out) && len(out) > 0 {
					if err := writeUp(out); err != nil {
						return err
					}
					out = out[:0]
				}
				out = appendChunk(out, data, trailer, done)
				if done {
					x.bodyLeft = 0
					break
				}
			}
			if len(out) > 0 {
				if err := writeUp(out); err != nil {
					return err
				}
				out = out[:0]
			}
			if x.bodyLeft == 0 {
				return nil
			}
		}
		// Need more from the client.
		if cc.r == cc.w {
			cc.r, cc.w = 0, 0
		} else if cc.w == len(cc.rbuf) {
			if cc.r == 0 {
				// A chunk-size line or trailer larger than the
				// buffer: the decoder refuses those first.
				return errClientBody
			}
			cc.compact()
		}
		// Deadline first, then the stop flag: waitPump sets the flag and
		// then a deadline in the past, so either this sees the flag or
		// the read sees that deadline.
		cc.setReadDeadline(cc.cfg.idleTimeout)
		if x.stop.Load() {
			return errPumpStopped
		}
		if err := cc.read(); err != nil {
			if x.stop.Load() {
				return errPumpStopped
			}
			return errClientBody
		}
	}
}

// readResponseHead reads until the final response head is parsed into
// cc.ex.resp; interim 1xx responses (but 101) are passed to the client.
func (x *exchange) readResponseHead() error {
	cc := x.cc
	if x.ub == nil {
		x.ub = getBuf()
	}
	resp := &cc.ex.resp
	for {
		err := resp.Parse(x.ub[x.ur:x.uw], http1.Limits{MaxHeadBytes: ioBufSize}, x.method)
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
			continue
		}
		if err != nil {
			return err
		}
		if resp.Status >= 200 || resp.Status == 101 {
			return nil
		}
		// 1xx: 100 Continue (the client sent Expect), 103 Early Hints.
		// An HTTP/1.0 client gets none of them.
		interim := x.ub[x.ur : x.ur+resp.HeadLen]
		x.ur += resp.HeadLen
		if cc.ex.req.Minor > 0 {
			x.interim = true
			h := cc.appendResponseHead(cc.ex.wbuf[:0], interim, true, -1)
			cc.ex.wbuf = h
			if err := cc.write(h); err != nil {
				return err
			}
		}
	}
}

// pumpErrorOr prefers the body pump's error (the client's fault) over the
// upstream read error it caused.
func (x *exchange) pumpErrorOr(err error) error {
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

// waitPump ends the body pump: stopped at once (stop) or waited for.
// It returns the pump's error.
func (x *exchange) waitPump(stop bool) error {
	if x.pump == nil {
		return nil
	}
	if stop {
		x.stop.Store(true)
		x.cc.c.SetReadDeadline(aLongTimeAgo)
	}
	err := <-x.pump
	x.pump = nil
	// The pump set or the stop spoiled the read deadline: the next read
	// sets its own.
	x.cc.readDeadline = aLongTimeAgo
	if err == errPumpStopped {
		err = nil
	}
	return err
}

var aLongTimeAgo = time.Unix(1, 0)

// failBeforeResponse answers an exchange that failed before any response
// head reached the client.
func (cc *clientConn) failBeforeResponse(x *exchange, err error) bool {
	perr := x.waitPump(true)
	if perr != nil {
		err = perr
	}
	if x.up != nil {
		if !errors.Is(err, errClientBody) && !errors.Is(err, context.Canceled) {
			// Hook (upstream resilience): an upstream that failed
			// after the connect counts as a 5xx for outlier detection.
			x.wc.ReportStatus(x.up.EndpointIndex(), 0)
		}
		x.up.Discard()
		x.wc.RecordRequest(x.start, false)
	}
	if x.ub != nil {
		putBuf(x.ub)
		x.ub = nil
	}
	if errors.Is(err, errClientBody) {
		cc.refuse(400, "malformed or incomplete request body")
		return false
	}
	status, body := classify(err)
	if cc.m.log.IsDebug() {
		cc.m.log.Debug("upstream request failed", "status", status, "error", err)
	}
	if x.up == nil && errors.Is(err, context.Canceled) {
		return false // a forced drain: nobody to answer
	}
	// The request body may be partly unread: the connection closes.
	keep := x.bodyDone && !cc.ex.req.Close && !cc.m.draining.Load()
	b := appendSimpleResponse(cc.ex.wbuf[:0], status, body, !keep)
	cc.ex.wbuf = b
	cc.sent(status)
	if cc.write(b) != nil {
		return false
	}
	if !x.bodyDone {
		cc.lingerClose() // the body is unread: let the client read the answer
	}
	return keep
}

// classify maps an upstream failure to a status and a short body: 503
// when no upstream took the request (or a circuit breaker refused it), 504
// on a timeout, 502 otherwise.
func classify(err error) (int, string) {
	var ce *upstream.ConnectError
	var pe *http1.Error
	switch {
	case errors.Is(err, upstream.ErrOverflow):
		// A circuit breaker refused the request: at once, not queued.
		return 503, "upstream overflow"
	case errors.As(err, &ce):
		return 503, "upstream connect error: " + dialReason(ce.Err)
	case errors.Is(err, upstream.ErrNoEndpoint):
		return 503, "upstream connect error: no healthy upstream endpoint"
	case isTimeout(err):
		return 504, "upstream timeout"
	case errors.As(err, &pe):
		return 502, "upstream sent a malformed response"
	}
	return 502, "upstream error"
}

// dialReason is a connect error in a few words, without addresses.
func dialReason(err error) string {
	var errno syscall.Errno
	switch {
	case err == nil:
		return "connect failed"
	case isTimeout(err) || errors.Is(err, context.DeadlineExceeded):
		return "connect timeout"
	case errors.As(err, &errno):
		return errno.Error()
	}
	return "connect failed"
}
