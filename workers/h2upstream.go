package workers

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"golang.org/x/net/http2"

	"github.com/hotproxy/hotproxy/config"
	"github.com/hotproxy/hotproxy/upstream"
)

// HTTP/2 upstreams (clusters.http2 = true): each worker's view of such a
// cluster has an http2.Transport of its own, whose connections are dialed
// to the endpoint the cluster's load balancer picks (DialTCPKey: the
// balancer, connect retries over the endpoints, upstream_cx_* and
// max_connections as for TCP proxying), cleartext with prior knowledge, or
// TLS with ALPN h2 when [clusters.tls] is set. The transport multiplexes
// requests over those connections and dials another only when they are
// full, so the balancer chooses per connection, not per request.
//
// HTTP/2 clients' requests come from h2handle.go, HTTP/1.1 clients' from
// h2upstream_h1.go.

type h2Upstream struct {
	wc     *upstream.WorkerCluster
	t      *http2.Transport
	scheme string // "http" (prior knowledge) or "https"

	mu     sync.Mutex // guards conns and closed
	conns  map[*h2UpstreamConn]struct{}
	closed bool // the Manager is closed: no new connection
}

// http2UpstreamOf returns the HTTP/2 transport of worker cluster view wc,
// or nil for a cluster spoken to in HTTP/1.1. Built on first use, and
// kept with the view: a view of an older snapshot keeps its transport
// until its connections close when idle.
func (m *Manager) http2UpstreamOf(snap *Snapshot, wc *upstream.WorkerCluster) *h2Upstream {
	h := &m.h2
	if v, ok := h.upstreams.Load(wc); ok {
		return v.(*h2Upstream)
	}
	var u *h2Upstream
	if cs := snap.cfg.Cluster(wc.Name()); cs != nil && cs.HTTP2 {
		u = newH2Upstream(wc, cs)
		// Close ends every connection, busy or not: the transport's
		// own goroutines end with them.
		context.AfterFunc(m.ctx, u.closeAll)
	}
	v, _ := h.upstreams.LoadOrStore(wc, u)
	return v.(*h2Upstream)
}

func newH2Upstream(wc *upstream.WorkerCluster, cs *config.Cluster) *h2Upstream {
	u := &h2Upstream{wc: wc, scheme: "http"}
	if cs.TLS != nil {
		u.scheme = "https"
	}
	u.t = &http2.Transport{
		AllowHTTP: true,
		// Accept-Encoding and the body pass as they are: the transport
		// must not ask for gzip and decode it behind the client's back.
		DisableCompression: true,
		IdleConnTimeout:    cs.IdleTimeout.D(),
		DialTLSContext:     u.dial,
	}
	return u
}

// dial is the transport's dial: the cluster's balancer picks the endpoint
// (addr, the request URL's host, is the cluster's name and means nothing).
func (u *h2Upstream) dial(ctx context.Context, _, _ string, _ *tls.Config) (net.Conn, error) {
	c, endpoint, done, err := u.wc.DialTCPKey(ctx, 0)
	if err != nil {
		return nil, err
	}
	conn := &h2UpstreamConn{Conn: c, done: done, u: u}
	u.mu.Lock()
	closed := u.closed
	if !closed {
		if u.conns == nil {
			u.conns = make(map[*h2UpstreamConn]struct{})
		}
		u.conns[conn] = struct{}{}
	}
	u.mu.Unlock()
	if closed {
		conn.Close()
		return nil, net.ErrClosed
	}
	// A TLS cluster's DialTCPKey did the handshake (upstream/tls.go),
	// offering ALPN h2 only, since the cluster says http2.
	if tc, ok := c.(interface{ ConnectionState() tls.ConnectionState }); ok {
		if p := tc.ConnectionState().NegotiatedProtocol; p != config.ALPNHTTP2 {
			conn.Close()
			return nil, fmt.Errorf("cluster %q: endpoint %s: ALPN chose %q, not h2 (the upstream does not speak HTTP/2 over TLS; remove clusters.http2)", u.wc.Name(), endpoint, p)
		}
	}
	return conn, nil
}

func (u *h2Upstream) closeIdle() { u.t.CloseIdleConnections() }

// closeAll closes every connection of u, busy or idle, and any dialed
// later.
func (u *h2Upstream) closeAll() {
	u.mu.Lock()
	u.closed = true
	conns := make([]*h2UpstreamConn, 0, len(u.conns))
	for c := range u.conns {
		conns = append(conns, c)
	}
	u.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// h2UpstreamConn is one connection of an HTTP/2 upstream: its close ends
// its use of its endpoint (least_request) and takes it out of u's set.
type h2UpstreamConn struct {
	net.Conn
	done func()
	u    *h2Upstream
}

func (c *h2UpstreamConn) Close() error {
	c.done() // idempotent
	c.u.mu.Lock()
	delete(c.u.conns, c)
	c.u.mu.Unlock()
	return c.Conn.Close()
}

// proxyHTTP2 forwards r to an HTTP/2 upstream through u's transport.
// request_timeout (or the route's timeout) bounds the wait for the
// response head; the body then streams for as long as it flows.
func (h *h2Handler) proxyHTTP2(w http.ResponseWriter, r *http.Request, lv *listenerView, rt *route, u *h2Upstream, start time.Time, res *h2Result) {
	cc := h.cc
	timeout := rt.timeout
	if timeout == 0 {
		timeout = lv.requestTimeout
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	timer := time.AfterFunc(timeout, func() { cancel() })

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
	out.URL.Scheme, out.URL.Host = u.scheme, u.wc.Name()
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		out.Body, out.ContentLength = r.Body, r.ContentLength
	}
	cc.copyH2UpstreamHeader(out.Header, r)
	resp, err := u.t.RoundTrip(out.WithContext(ctx))
	stopped := timer.Stop()
	if err != nil {
		u.wc.RecordRequest(start, false)
		if !stopped && errors.Is(err, context.Canceled) && r.Context().Err() == nil {
			err = context.DeadlineExceeded // the request timeout, not the client
		}
		status, body := classify(err)
		if log := cc.m.log; log.IsDebug() {
			log.Debug("HTTP/2 upstream request failed", "cluster", u.wc.Name(), "status", status, "error", err)
		}
		res.status = h2Answer(w, cc.st, status, body)
		return
	}
	defer resp.Body.Close()
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

// copyH2UpstreamHeader is appendH2UpstreamHead's field list for an HTTP/2
// upstream request: "TE: trailers" is the one TE HTTP/2 allows.
func (cc *clientConn) copyH2UpstreamHeader(dst http.Header, r *http.Request) {
	for k, vs := range r.Header {
		switch k {
		case "Te":
			for _, v := range vs {
				if v == "trailers" {
					dst["Te"] = []string{"trailers"}
				}
			}
			continue
		case "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Proxy-Authorization":
			continue
		}
		if h2HopByHop(k) {
			continue
		}
		dst[k] = vs
	}
	xff := string(cc.clientIP)
	if prior := r.Header["X-Forwarded-For"]; cc.cfg.trustXFF && len(prior) > 0 {
		xff = joinXFF(prior, xff)
	}
	dst["X-Forwarded-For"] = []string{xff}
	if r.TLS != nil {
		dst["X-Forwarded-Proto"] = []string{"https"}
	} else {
		dst["X-Forwarded-Proto"] = []string{"http"}
	}
	if r.Host != "" {
		dst["X-Forwarded-Host"] = []string{r.Host}
	}
	if _, ok := dst["X-Request-Id"]; !ok {
		dst["X-Request-Id"] = []string{string(appendRequestID(nil))}
	}
}

func joinXFF(prior []string, client string) string {
	var b []byte
	for _, v := range prior {
		if v != "" {
			b = append(b, v...)
			b = append(b, ", "...)
		}
	}
	return string(append(b, client...))
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
