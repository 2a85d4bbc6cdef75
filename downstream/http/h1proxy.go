package httpfront

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/route"
	"github.com/hotproxy/hotproxy/upstream"
)

// errClientBody marks an exchange cut because the client's request body
// was malformed, cut short or too slow (exchange.ErrClientBody): the
// client is answered 400 (if nothing was sent yet) and its connection
// closed; never a 5xx that blames the upstream, never another request
// parsed from that connection.
var errClientBody = exchange.ErrClientBody

// errPumpStopped: the exchange ended before the request body did, and the
// body pump was told to stop.
var errPumpStopped = errors.New("request body no longer needed")

// h1Exchange is one proxied request's state, kept in its connection's pooled
// h1State (so that it costs no allocation).
type h1Exchange struct {
	cc    *Conn
	wc    *upstream.WorkerCluster
	up    *upstream.Conn
	head  []byte // the client's request head (in rbuf): valid only until the body pump starts refilling rbuf
	start time.Time
	// method is what the response parser needs of the request's method,
	// kept apart from head, which the body pump may overwrite.
	method     []byte
	idempotent bool // the request may be sent twice (RFC 9110 §9.2.2)
	upgrade    bool // the upstream was offered an upgrade (appendUpgrade): only then may it answer 101
	// rechunk: a chunked response body goes to the client chunked
	// (HTTP/1.1), not de-chunked (HTTP/1.0); copyChunked sets it.
	rechunk bool

	// The request body still to come from the client after the head
	// write; bodyLeft < 0 for chunked.
	bodyDone bool
	bodyLeft int64
	pump     chan error // the body pump's result, while one runs
	stop     atomic.Bool
	// bodyRead: the pump has read the client's whole body, and what is
	// left of its work is writing the last of it to the upstream.
	bodyRead atomic.Bool
	// bodyTaken: some of the body was taken from the client (with the
	// head, or by the pump): the request can no longer go again on a
	// fresh connection (read by the try once the pump stopped).
	bodyTaken bool

	// The upstream's read buffer and its unconsumed bytes, and the read
	// deadline last set while a response body is copied (ReadUpstream).
	in           exchange.ReadBuffer
	bodyDeadline time.Time

	// interim: a 1xx response went to the client (in wbuf, where the
	// request for a retry was): the request is not sent again.
	interim bool
	retries int // retries made (retry_on and a stale connection)
	tries   exchange.Tries
	// The request as the tries send it: the head for the upstream (and
	// the buffered body that goes with it), and its hash_on key.
	out, outBody []byte
	key          uint64
}

// proxy forwards the request to rt's cluster and the response back. It
// reports whether the client connection may carry another request.
func (cc *Conn) proxy(lv *View, rt *route.Route, start time.Time, keep bool) bool {
	ex := cc.ex
	req := &ex.req
	// The exchange lives in the pooled state: it would escape to the heap
	// on every request (the body pump refers to it).
	x := &ex.xchg
	*x = h1Exchange{cc: cc, wc: lv.Clusters[rt.Index], start: start}
	x.head = cc.rbuf[cc.r : cc.r+req.HeadLen]
	x.method = methodOther
	x.upgrade = forwardsUpgrade(req.Upgrade.Bytes(x.head))
	method := bytesString(req.Method.Bytes(x.head))
	x.idempotent = exchange.Idempotent(method)
	if method == "HEAD" {
		x.method = methodHEAD
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
	if err != nil {
		return cc.failBeforeResponse(x, err)
	}
	x.wc.RecordRequest(start, true)
	// Hook (upstream resilience): the outcome feeds outlier detection
	// and the per-endpoint counters; atomics only.
	x.wc.ReportStatus(x.up.EndpointIndex(), int(cc.ex.resp.Status))
	return x.forwardResponse(keep)
}

// Methods as the response parser sees them: only HEAD changes a
// response's framing (CONNECT is refused before it gets here).
var (
	methodHEAD  = []byte("HEAD")
	methodOther = []byte("GET")
)

// appendUpstreamHead writes the request head as the upstream gets it
// (exchange.ForwardedFields decides the fields) from the parsed head, in
// place: the spans are read where they lie in the connection's buffer.
func (cc *Conn) appendUpstreamHead(b, head []byte, upstreamHost string) []byte {
	req := &cc.ex.req
	b = exchange.AppendHTTP1RequestLine(b, req.Method.Bytes(head), req.Target.Bytes(head), req.Host.Bytes(head), upstreamHost)
	fwd := &cc.ex.fwd
	fwd.Reset(cc.client(), req.Host.Bytes(head), false)
	for i := range req.NFields {
		f := &req.Fields[i]
		if f.Hop {
			// The fields Connection names are stripped here and
			// must not come back in the trailer.
			if req.Framing == http1.FramingChunked && http1.EqualFold(f.Name.Bytes(head), "connection") {
				fwd.NoteConnection(f.Value.Bytes(head))
			}
			continue
		}
		if fwd.Take(f.Name.Bytes(head), f.Value.Bytes(head)) {
			b = appendField(b, f.Name.Bytes(head), f.Value.Bytes(head))
		}
	}
	b = fwd.AppendHTTP1(b)
	b = appendUpgrade(b, req.Upgrade.Bytes(head))
	switch req.Framing {
	case http1.FramingLength:
		b = exchange.AppendHTTP1Framing(b, req.ContentLength)
	case http1.FramingChunked:
		b = exchange.AppendHTTP1Framing(b, exchange.BodyChunked)
	}
	return append(b, "\r\n"...)
}

// client is what the upstream head says of the client connection.
func (cc *Conn) client() exchange.Client {
	return exchange.Client{IP: cc.clientIP, TLS: cc.tls != nil, TrustForwardedFor: cc.settings.TrustXFF}
}

// appendUpgrade appends "Connection: upgrade" and the Upgrade field for
// the protocols of a client's Upgrade value that the proxy passes on:
// all but HTTP/2 (h2c, and h2, which only TLS's ALPN may choose), as
// Envoy does. A tunnel after a 101 carries whatever the client sends past
// routing: WebSocket frames are no requests, but an HTTP/2 connection's
// streams are, each of them to any path. The request is then served as
// plain HTTP/1.1 (RFC 9110 §7.8: a server may ignore an Upgrade; curl
// --http2 sends h2c and takes an HTTP/1.1 answer). Nothing when no
// protocol is left.
func appendUpgrade(b, upgrade []byte) []byte {
	if !forwardsUpgrade(upgrade) {
		return b
	}
	b = append(b, "Connection: upgrade\r\nUpgrade: "...)
	first := true
	forEachProtocol(upgrade, func(p, name []byte) {
		if isHTTP2Protocol(name) {
			return
		}
		if !first {
			b = append(b, ", "...)
		}
		b = append(b, p...)
		first = false
	})
	return append(b, "\r\n"...)
}

// forwardsUpgrade reports whether an Upgrade value names a protocol the
// proxy passes on (appendUpgrade).
func forwardsUpgrade(upgrade []byte) bool {
	found := false
	forEachProtocol(upgrade, func(_, name []byte) { found = found || !isHTTP2Protocol(name) })
	return found
}

// namesHTTP2 reports whether an Upgrade value names h2c or h2.
func namesHTTP2(upgrade []byte) bool {
	found := false
	forEachProtocol(upgrade, func(_, name []byte) { found = found || isHTTP2Protocol(name) })
	return found
}

func isHTTP2Protocol(name []byte) bool {
	return http1.EqualFold(name, "h2c") || http1.EqualFold(name, "h2")
}

// forEachProtocol calls fn with each protocol of an Upgrade value (the
// parser has checked its syntax: a list of protocol-name["/"version]) and
// its name.
func forEachProtocol(upgrade []byte, fn func(protocol, name []byte)) {
	for len(upgrade) > 0 {
		p := upgrade
		if i := bytes.IndexByte(upgrade, ','); i >= 0 {
			p, upgrade = upgrade[:i], upgrade[i+1:]
		} else {
			upgrade = nil
		}
		p = bytes.Trim(p, " \t")
		if len(p) == 0 {
			continue
		}
		name := p
		if i := bytes.IndexByte(p, '/'); i >= 0 {
			name = p[:i]
		}
		fn(p, name)
	}
}

// isProxyAuth: Proxy-Authorization and Proxy-Authenticate concern one hop
// and are never forwarded.
func isProxyAuth(name []byte) bool {
	return len(name) > 6 && (name[0]|0x20) == 'p' &&
		(http1.EqualFold(name, "proxy-authorization") || http1.EqualFold(name, "proxy-authenticate"))
}

// readResponseHead reads until the final response head is parsed into
// cc.ex.resp; interim 1xx responses (but 101) are passed to the client.
func (x *h1Exchange) readResponseHead() error {
	if x.in.B == nil {
		x.in.B = x.cc.takeBuf(SmallBufSize)
	}
	return exchange.ReadHTTP1Head(x.up, &x.in, &x.cc.ex.resp, x.method, IOBufSize, x)
}

var _ exchange.HeadReadHooks = (*h1Exchange)(nil)

// InterimResponse passes a 1xx (100 Continue: the client sent Expect; 103
// Early Hints) to the client; an HTTP/1.0 client gets none of them.
func (x *h1Exchange) InterimResponse(head []byte) error {
	cc := x.cc
	if cc.ex.req.Minor == 0 {
		return nil
	}
	x.interim = true
	h := cc.appendResponseHead(cc.ex.wbuf[:0], head, true, -1)
	cc.ex.wbuf = h
	return cc.write(h)
}

// ReadFailed prefers the body pump's error (exchange.HeadReadHooks).
func (x *h1Exchange) ReadFailed(err error) error { return exchange.PumpErrorOr(&x.pump, err) }

// failBeforeResponse answers an exchange that failed before any response
// head reached the client.
func (cc *Conn) failBeforeResponse(x *h1Exchange, err error) bool {
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
	if x.in.B != nil {
		cc.giveBuf(x.in.B)
		x.in.B = nil
	}
	if errors.Is(err, errClientBody) {
		cc.refuse(400, "malformed or incomplete request body")
		return false
	}
	status, body := exchange.FailureStatus(err)
	if cc.l.Env.Log.IsDebug() {
		cc.l.Env.Log.Debug("upstream request failed", "status", status, "error", err)
	}
	if x.up == nil && errors.Is(err, context.Canceled) {
		return false // a forced drain: nobody to answer
	}
	// The request body may be partly unread: the connection closes.
	keep := x.bodyDone && !cc.ex.req.Close && !cc.l.Draining.Load()
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
