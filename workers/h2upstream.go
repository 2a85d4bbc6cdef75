package workers

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/hotproxy/hotproxy/exchange"
	"github.com/hotproxy/hotproxy/upstream"
)

// HTTP/2 upstreams (clusters.http2 = true): each worker's view of such a
// cluster keeps HTTP/2 client connections per endpoint (upstream.H2Pool)
// and picks the endpoint per request with the cluster's balancer, as the
// HTTP/1.1 path does (health, ejection, hash_on keys): a busy connection
// carrying every request to one endpoint would make round_robin,
// least_request, ring_hash and maglev mean nothing. Connections are
// dialed with upstream.DialEndpoint (connect timeout, TLS with ALPN h2,
// max_connections, upstream_cx_*), cleartext with prior knowledge
// otherwise. A request is tried again per its route's retry policy
// (h2upstream_retry.go).
//
// HTTP/2 clients' requests come from h2handle.go, HTTP/1.1 clients' from
// h2upstream_h1.go.

// http2UpstreamOf returns the HTTP/2 upstream of worker cluster view wc,
// whose routes said http2 (route.http2), or nil for a cluster spoken to
// in HTTP/1.1. Built on first use, and
// kept with the view: a view of an older snapshot keeps its connections
// until they close when idle.
func (m *Manager) http2UpstreamOf(snap *Snapshot, wc *upstream.WorkerCluster) *h2Upstream {
	h := &m.h2
	if v, ok := h.upstreams.Load(wc); ok {
		return v.(*h2Upstream)
	}
	var u *h2Upstream
	if opts, ok := snap.h2Upstreams[wc.Name()]; ok {
		u = &h2Upstream{pool: upstream.NewH2Pool(wc, opts), wc: wc}
		// Close ends every connection, busy or not: the transport's
		// own goroutines end with them.
		context.AfterFunc(m.ctx, u.pool.CloseAll)
	}
	v, _ := h.upstreams.LoadOrStore(wc, u)
	return v.(*h2Upstream)
}

// h2Upstream is a worker's view of a cluster that speaks HTTP/2: its
// multiplexed pool.
type h2Upstream struct {
	pool *upstream.H2Pool
	wc   *upstream.WorkerCluster
}

// proxyHTTP2 forwards r to an HTTP/2 upstream through u.
// request_timeout (or the route's timeout) bounds the wait for the
// response head; the body then streams for as long as it flows.
func (h *h2Handler) proxyHTTP2(w http.ResponseWriter, r *http.Request, lv *listenerView, rt *route, u *h2Upstream, hr *h2Request, start time.Time, res *h2Result) {
	cc := h.cc
	out := &http.Request{
		Method:     r.Method,
		URL:        new(url.URL),
		Proto:      "HTTP/2.0",
		ProtoMajor: 2,
		Host:       r.Host,
		Header:     make(http.Header, len(r.Header)+4),
		Trailer:    r.Trailer,
	}
	*out.URL = *r.URL
	out.URL.Scheme, out.URL.Host = u.pool.Scheme(), u.wc.Name()
	replayable := true
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		// The body streams from the client: it is sent once.
		out.Body, out.ContentLength = r.Body, r.ContentLength
		replayable = false
	}
	cc.copyH2UpstreamHeader(out.Header, &hr.fwd, r)
	try := h2TryRequest{
		out:        out,
		ctx:        r.Context(),
		key:        h2HashKey(&rt.hashOn, r, cc.clientIP),
		replayable: replayable,
		idempotent: idempotentMethod(r.Method),
	}
	reply, err := u.roundTrip(lv, rt, start, &try)
	res.retries = reply.retries
	res.upAddr = reply.endpoint
	if err != nil {
		u.wc.RecordRequest(start, false)
		status, body := classify(err)
		if log := cc.m.log; log.IsDebug() {
			log.Debug("HTTP/2 upstream request failed", "cluster", u.wc.Name(), "status", status, "error", err)
		}
		res.status = h2Answer(w, cc.st, status, body)
		return
	}
	defer reply.done()
	resp := reply.resp
	u.wc.RecordRequest(start, true)
	hd := w.Header()
	for k, vs := range resp.Header {
		if h2HopByHop(k) {
			continue
		}
		hd[k] = append(hd[k], vs...)
	}
	if resp.ContentLength >= 0 && r.Method != http.MethodHead {
		hd["Content-Length"] = []string{string(appendInt(nil, resp.ContentLength))}
	}
	cc.st.status(resp.StatusCode)
	res.status = resp.StatusCode
	w.WriteHeader(resp.StatusCode)
	if err := copyFlushing(w, resp.Body); err != nil {
		panic(http.ErrAbortHandler) // the client must not take it for a whole response
	}
	for k, vs := range resp.Trailer {
		hd[http.TrailerPrefix+k] = vs
	}
}

// idempotentMethod: a request of this method may be sent twice (RFC 9110
// §9.2.2), as the HTTP/1.1 paths decide.
func idempotentMethod(m string) bool {
	switch m {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		return true
	}
	return false
}

// copyH2UpstreamHeader is appendH2UpstreamHead's field list for an HTTP/2
// upstream request: the fields exchange.ForwardedFields keeps and adds.
func (cc *clientConn) copyH2UpstreamHeader(dst http.Header, fwd *exchange.ForwardedFields, r *http.Request) {
	fwd.Reset(cc.client(), stringBytes(r.Host), true)
	for k, vs := range r.Header {
		if takeHeader(fwd, k, vs) {
			dst[k] = vs
		}
	}
	addOwnFields(dst, fwd)
}

// addOwnFields adds the fields the proxy writes itself to an HTTP/2
// upstream request's header.
func addOwnFields(dst http.Header, fwd *exchange.ForwardedFields) {
	for {
		name, value, ok := fwd.Own()
		if !ok {
			return
		}
		dst[name] = []string{string(value)}
	}
}

// h2HopByHop: fields of one connection, which HTTP/2 forbids in a message
// (RFC 9113 §8.2.2), in either direction; and Content-Length, which the
// proxy sets from the body's framing.
func h2HopByHop(k string) bool {
	switch k {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "Te", "Trailer",
		"Content-Length", "Proxy-Authenticate":
		return true
	}
	return false
}

// copyFlushing copies an upstream body to the client, flushing after each
// read: nothing the upstream sent waits in the proxy.
func copyFlushing(w http.ResponseWriter, body io.Reader) error {
	buf := getBuf()
	defer putBuf(buf)
	f, _ := w.(http.Flusher)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if f != nil {
				f.Flush()
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
