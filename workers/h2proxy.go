package workers

import (
	"net/http"
	"strings"
	"time"

	"github.com/hotproxy/hotproxy/exchange"
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
	in exchange.ReadBuffer
	// pump reports the request body's end; nil while none runs.
	pump    chan error
	retries int
	tries   exchange.Tries
	out     []byte // the request head for the upstream
	key     uint64 // hash_on key
	sent    int64  // body bytes written to the client
}

func (h *h2Handler) proxyHTTP1(w http.ResponseWriter, r *http.Request, lv *listenerView, rt *route, wc *upstream.WorkerCluster, hr *h2Request, start time.Time, res *h2Result) {
	// The exchange lives in the stream's pooled state: handed to the
	// core's interfaces, it would escape to the heap on every request.
	x := &hr.xchg
	*x = h2Exchange{h: h, r: r, wc: wc, method: methodOther}
	if isGRPC(r.Header["Content-Type"]) {
		// Sent on all the same (the upstream may bridge), but a gRPC
		// server answers HTTP/1.1 with bytes that are no response: every
		// call a 502, and the operator would be told nothing.
		h.cc.m.grpcToHTTP1.Warn("a gRPC request is routed to a cluster that speaks HTTP/1.1; gRPC needs HTTP/2 to its server: set http2 = true on the cluster",
			"listener", lv.name, "cluster", wc.Name(), "path", r.URL.Path)
	}
	x.hasBody = r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
	switch r.Method {
	case "HEAD":
		x.method, x.idempotent = methodHEAD, true
	case "GET", "OPTIONS", "TRACE", "PUT", "DELETE":
		x.idempotent = true
	}
	hr.head = h.cc.appendH2UpstreamHead(hr.head[:0], &hr.fwd, r, wc.Name(), x.hasBody)
	defer func() {
		if x.in.B != nil {
			putBuf(x.in.B)
		}
		*x = h2Exchange{} // the pool keeps no request or connection
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
// :authority, the fields exchange.ForwardedFields keeps (x/net already
// refuses requests that carry HTTP/1.1's hop-by-hop fields) and adds, and
// framing of the proxy's own: Content-Length when the client declared
// it, otherwise chunked.
func (cc *clientConn) appendH2UpstreamHead(b []byte, fwd *exchange.ForwardedFields, r *http.Request, upstreamHost string, hasBody bool) []byte {
	host := stringBytes(r.Host)
	b = exchange.AppendHTTP1RequestLine(b, stringBytes(r.Method), stringBytes(r.RequestURI), host, upstreamHost)
	fwd.Reset(cc.client(), host, false)
	for name, values := range r.Header {
		if takeHeader(fwd, name, values) {
			for _, v := range values {
				b = appendField(b, stringBytes(name), stringBytes(v))
			}
		}
	}
	b = fwd.AppendHTTP1(b)
	switch {
	case hasBody && r.ContentLength > 0:
		b = exchange.AppendHTTP1Framing(b, r.ContentLength)
	case hasBody:
		b = exchange.AppendHTTP1Framing(b, exchange.BodyChunked)
	case r.Method == "POST" || r.Method == "PUT" || r.Method == "PATCH":
		// An empty body said so: some servers wait for a body of a
		// POST that gives no length.
		b = exchange.AppendHTTP1Framing(b, 0)
	}
	return append(b, "\r\n"...)
}

// takeHeader shows fwd every value of one http.Header entry and reports
// whether the entry goes upstream as it is.
func takeHeader(fwd *exchange.ForwardedFields, name string, values []string) bool {
	keep := false
	for _, v := range values {
		keep = fwd.Take(stringBytes(name), stringBytes(v))
	}
	return keep
}

// tryUntilResponse sends the head and, for a request without a body,
// reads the response head, trying again where the route's retry policy
// (exchange.Tries) says so. A request whose body streams from the client
// is tried once.
func (x *h2Exchange) tryUntilResponse(lv *listenerView, rt *route, head []byte, start time.Time) error {
	t := &x.tries
	t.Start(&rt.retry, x.wc, start, rt.timeout, !x.hasBody, x.idempotent)
	x.out = head
	x.key = h2HashKey(&rt.hashOn, x.r, x.h.cc.clientIP)
	err := exchange.RoundTrip(t, x)
	x.retries = t.Retries
	if err == nil && t.PerTry() {
		x.up.SetDeadline(t.Deadline())
	}
	return err
}

var _ exchange.UpstreamTransport = (*h2Exchange)(nil)

// Try sends the request once on a connection of the cluster's HTTP/1.1
// pool (exchange.UpstreamTransport) and, when it has no body, reads the
// response head.
func (x *h2Exchange) Try(n, avoid int, fresh bool, tryDeadline time.Time) (int, exchange.Try, error) {
	ctx := x.r.Context()
	none := exchange.Try{Endpoint: -1}
	if err := ctx.Err(); err != nil {
		return 0, none, err // the client reset the stream: dial nothing
	}
	var err error
	x.up, err = x.wc.AcquireTry(ctx, x.key, n, avoid, fresh, x.idempotent && !x.hasBody)
	if err != nil {
		x.up = nil
		return 0, none, err
	}
	if err := ctx.Err(); err != nil {
		// Reset while a connection was found: nothing was sent on it,
		// so it goes back to the pool as it came.
		x.up.Release(true)
		x.up = nil
		return 0, none, err
	}
	x.up.SetDeadline(tryDeadline)
	_, err = x.up.Write(x.out)
	status := 0
	if err == nil && !x.hasBody {
		if err = x.readResponseHead(); err == nil {
			status = x.resp.Status
		}
	}
	return status, exchange.Try{Endpoint: x.up.EndpointIndex(), Stale: x.up.Reused() && x.in.W == 0}, err
}

// Abandon closes the try's connection: a response to repeat is read no
// further.
func (x *h2Exchange) Abandon() {
	if x.up != nil {
		x.up.Discard()
		x.up = nil
	}
	x.in.R, x.in.W = 0, 0
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

// isGRPC reports whether a request's content type is gRPC's
// (application/grpc, or application/grpc+proto and the like), not
// gRPC-Web's, which HTTP/1.1 carries.
func isGRPC(contentType []string) bool {
	if len(contentType) != 1 {
		return false
	}
	ct, ok := strings.CutPrefix(contentType[0], "application/grpc")
	return ok && (ct == "" || ct[0] == '+' || ct[0] == ';')
}
