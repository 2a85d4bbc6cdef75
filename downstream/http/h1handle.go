package httpfront

import (
	"net/http"
	"strconv"
	"time"
	"unsafe"

	"github.com/hotproxy/hotproxy/downstream/tcp"
	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/http1"
	"github.com/hotproxy/hotproxy/route"
)

// handle serves the request whose head is parsed at rbuf[r:]. It consumes
// the head (and the body, for a proxied request) from rbuf and reports
// whether the connection may carry another request. Each path counts the
// response status just before writing the response head, so that a client
// that has read a response finds it counted.
func (cc *Conn) handle() bool {
	ex := cc.ex
	req := &ex.req
	buf := cc.rbuf[cc.r:cc.w]
	start := time.Now()
	st := cc.st
	st.RequestStarted()

	if cc.logs != nil {
		cc.beginRecord(buf, start)
	}
	keep := !req.Close && !cc.l.Draining.Load()
	lv := cc.l.Host.View()
	var rt *route.Route
	switch {
	case lv == nil:
	case req.Connect:
		// Only a route that says connect = true opens a tunnel: a
		// route meant for requests never does.
		rt = lv.Routes.MatchConnect(bytesString(req.Target.Bytes(buf)), cc.sni, cc)
	default:
		ex.path = http1.CleanPath(ex.path[:0], req.Target.Bytes(buf))
		rt = lv.Routes.Match(bytesString(req.Host.Bytes(buf)), bytesString(ex.path), cc.sni, cc)
	}
	switch {
	case cc.overloaded(&keep): // overload.go here: 503, keep-alive off, shrunk timeouts
	case req.Connect && rt == nil:
		keep = cc.answer(http.StatusMethodNotAllowed, "CONNECT is not allowed here (no route with connect = true for this host)", false)
	case req.Connect:
		keep = cc.connectTunnel(lv, rt)
	case rt == nil:
		keep = cc.answer(http.StatusNotFound, NoRouteBody, keep)
	case rt.Direct != nil:
		keep = cc.answerDirect(rt.Direct, keep)
	default:
		// A cluster with http2 = true (h2upstream_h1.go).
		if handled, k := cc.proxyViaHTTP2(lv, rt, start, keep); handled {
			keep = k
		} else {
			keep = cc.proxy(lv, rt, start, keep)
		}
	}
	// One clock read for the request's end: its time, and the start of
	// the idle wait that follows (waitReadable takes ended).
	took := time.Since(start)
	st.RequestEnded(took)
	cc.ended = start.Add(took)
	if cc.logs != nil {
		cc.logRequest(rt, start)
	}
	return keep
}

const NoRouteBody = "no route matched"

// answer sends one of the proxy's own plain-text responses. A request body
// is not read: the connection closes after the answer instead.
func (cc *Conn) answer(status int, body string, keep bool) bool {
	req := &cc.ex.req
	cc.r += req.HeadLen
	keep = keep && req.Framing == http1.FramingNone
	if req.Minor == 0 && keep {
		keep = false // an HTTP/1.0 answer without "keep-alive" closes
	}
	b := appendSimpleResponse(cc.ex.wbuf[:0], status, body, !keep)
	cc.ex.wbuf = b
	cc.sent(status)
	if cc.write(b) != nil {
		return false
	}
	if req.Framing != http1.FramingNone {
		cc.lingerClose() // the body is unread: let the client read the answer
	}
	return keep
}

func (cc *Conn) answerDirect(d *route.DirectResponse, keep bool) bool {
	req := &cc.ex.req
	head := cc.rbuf[cc.r : cc.r+req.HeadLen]
	isHead := http1.EqualFold(req.Method.Bytes(head), "HEAD")
	cc.r += req.HeadLen
	keep = keep && req.Framing == http1.FramingNone
	b := appendStatusLine(cc.ex.wbuf[:0], d.Status, "")
	b = append(b, "Content-Type: "...)
	b = append(b, d.ContentType[0]...)
	b = append(b, "\r\n"...)
	if d.ContentLength != nil {
		b = append(b, "Content-Length: "...)
		b = append(b, d.ContentLength[0]...)
		b = append(b, "\r\n"...)
	}
	b = appendConnection(b, req.Minor, keep)
	b = append(b, "\r\n"...)
	if !isHead {
		b = append(b, d.Body...)
	}
	cc.ex.wbuf = b
	cc.sent(d.Status)
	if cc.write(b) != nil {
		return false
	}
	if req.Framing != http1.FramingNone {
		cc.lingerClose() // the body is unread: let the client read the answer
	}
	return keep
}

// connectTunnel answers a CONNECT with 200 and relays the bytes both ways
// to an endpoint of the route's cluster, a new connection (never one of
// the HTTP pool). The client connection ends with the tunnel.
func (cc *Conn) connectTunnel(lv *View, rt *route.Route) bool {
	req := &cc.ex.req
	cc.r += req.HeadLen
	up, _, done, err := lv.Clusters[rt.Index].DialTCP(cc.l.Env.Ctx)
	if err != nil {
		status, body := exchange.FailureStatus(err)
		return cc.answer(status, body, false)
	}
	defer done()
	defer up.Close()
	upTCP, ok := tcp.UnwrapTCP(up)
	if !ok {
		return cc.answer(http.StatusBadGateway, "upstream error", false)
	}
	b := append(cc.ex.wbuf[:0], "HTTP/1.1 200 Connection Established\r\n\r\n"...)
	cc.ex.wbuf = b
	cc.st.Status(http.StatusOK)
	if cc.write(b) != nil {
		return false
	}
	if cc.r < cc.w {
		// Bytes the client sent right behind its CONNECT.
		if _, err := upTCP.Write(cc.rbuf[cc.r:cc.w]); err != nil {
			return false
		}
		cc.r = cc.w
	}
	cc.relay(upTCP)
	return false
}

// appendConnection says whether the connection stays open, where the
// version's default does not already say it.
func appendConnection(b []byte, minor uint8, keep bool) []byte {
	switch {
	case !keep:
		return append(b, "Connection: close\r\n"...)
	case minor == 0:
		return append(b, "Connection: keep-alive\r\n"...)
	}
	return b
}

// appendStatusLine appends "HTTP/1.1 <status> <reason>\r\n"; an empty
// reason is the standard one.
func appendStatusLine(b []byte, status int, reason string) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = appendInt(b, int64(status))
	b = append(b, ' ')
	if reason == "" {
		reason = http.StatusText(status)
	}
	b = append(b, reason...)
	return append(b, "\r\n"...)
}

func appendInt(b []byte, v int64) []byte { return strconv.AppendInt(b, v, 10) }

// bytesString views b as a string without copying, for lookups that do
// not keep it.
func bytesString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// stringBytes views s as bytes without copying, for reads that do not
// keep it; the bytes must never be written.
func stringBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// appendSimpleResponse is a plain-text answer of the proxy's own: body and
// a newline.
func appendSimpleResponse(b []byte, status int, body string, closeConn bool) []byte {
	b = appendStatusLine(b, status, "")
	b = append(b, "Content-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nContent-Length: "...)
	b = appendInt(b, int64(len(body)+1))
	if closeConn {
		b = append(b, "\r\nConnection: close"...)
	}
	b = append(b, "\r\n\r\n"...)
	b = append(b, body...)
	return append(b, '\n')
}

func isTimeout(err error) bool { return exchange.IsTimeout(err) }

// refuse answers a request that cannot be processed and ends the
// connection gracefully: the answer, a FIN, then what the client still
// sends is read and dropped for a moment, so that it reads the answer
// rather than a reset.
func (cc *Conn) refuse(status int, reason string) {
	cc.sent(status)
	b := cc.ex.wbuf[:0]
	b = appendSimpleResponse(b, status, reason, true)
	cc.ex.wbuf = b
	if cc.write(b) != nil {
		return
	}
	cc.lingerClose()
}

// lingerClose half-closes and drains what the client still sends for at
// most lingerTime or lingerBytes.
func (cc *Conn) lingerClose() {
	const (
		lingerTime  = 500 * time.Millisecond
		lingerBytes = 256 << 10
	)
	cc.closeWrite()
	cc.c.SetReadDeadline(time.Now().Add(lingerTime))
	cc.readDeadline = time.Time{}
	buf := cc.rbuf
	if buf == nil {
		buf = getBuf()
		defer putBuf(buf)
	}
	for n := 0; n < lingerBytes; {
		k, err := cc.c.Read(buf[:min(len(buf), IOBufSize)])
		n += k
		if err != nil {
			break
		}
	}
	cc.r, cc.w = 0, 0
}
