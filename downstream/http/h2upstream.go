package httpfront

import (
	"context"

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
// otherwise. A request is tried again per its route's retry policy,
// through exchange.H2Transport (exchange.RoundTrip's one loop).
//
// HTTP/2 clients' requests come from h2front_h2.go, HTTP/1.1 clients'
// from h2upstream_h1.go.

// http2UpstreamOf returns the HTTP/2 upstream of worker cluster view wc,
// whose routes said http2 (route.http2), or nil for a cluster spoken to
// in HTTP/1.1. Built on first use, and
// kept with the view: a view of an older snapshot keeps its connections
// until they close when idle.
func (e *Env) http2UpstreamOf(view *View, wc *upstream.WorkerCluster) *h2Upstream {
	h := &e.h2
	if v, ok := h.upstreams.Load(wc); ok {
		return v.(*h2Upstream)
	}
	var u *h2Upstream
	if opts, ok := view.H2Upstreams[wc.Name()]; ok {
		u = &h2Upstream{pool: upstream.NewH2Pool(wc, opts), wc: wc}
		// Close ends every connection, busy or not: their read loops
		// and control writers end with them.
		context.AfterFunc(e.Ctx, u.pool.CloseAll)
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
