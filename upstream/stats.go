package upstream

import (
	"net"
	"sync/atomic"
	"time"

	"github.com/hotproxy/hotproxy/stats"
)

// Stats are one worker's handles on one cluster's stats, bound to that
// worker's lane: the request path adds to them without a lookup, a lock or
// an allocation. Names (cluster.<name>.*):
//
//	upstream_cx_total         counter  connections opened to an endpoint
//	upstream_cx_active        gauge    connections open now (sum over generations)
//	upstream_cx_connect_fail  counter  connects that failed (refused, timed out)
//	upstream_rq_total         counter  HTTP requests sent to the cluster (one per
//	                                   client request, whatever the connect retries)
//	upstream_rq_time          histogram  milliseconds from sending a request to
//	                                   the upstream's response headers
//	upstream_cx_overflow      counter  requests refused by max_connections
//	upstream_rq_pending_overflow counter  requests refused by max_requests,
//	                                   max_pending_requests or max_retries
//	lb_healthy_panic          counter  picks made in panic mode (no endpoint
//	                                   healthy and not ejected: all used)
//	upstream_rq_retry         counter  retries made by a route's retry_on
//	upstream_rq_retry_success counter  retried requests whose last try got a
//	                                   response that was not retried
//
// and, for a cluster with [clusters.tls] only (tls.go):
//
//	ssl.handshake             counter  TLS handshakes completed with an endpoint
//	ssl.session_reused        counter  of which resumed a session (no full
//	                                   handshake)
//	ssl.connection_error      counter  handshakes that failed: verification,
//	                                   no common version, a client certificate
//	                                   wanted, a timeout (each is also an
//	                                   upstream_cx_connect_fail)
type Stats struct {
	CxTotal           stats.CounterLane
	CxActive          stats.GaugeLane
	CxConnectFail     stats.CounterLane
	RqTotal           stats.CounterLane
	RqTime            *stats.HistogramLane
	CxOverflow        stats.CounterLane
	RqPendingOverflow stats.CounterLane
	LBHealthyPanic    stats.CounterLane
	RqRetry           stats.CounterLane
	RqRetrySuccess    stats.CounterLane

	// ssl is nil for a cluster without TLS: BindStats resolves it for a
	// view that has TLS, from where NewStats was given.
	ssl     *sslStats
	store   *stats.Store
	cluster string
	lane    int
}

// NewStats resolves the stats of cluster on lane (1 + the worker index,
// lane 0 being the main goroutine's).
func NewStats(st *stats.Store, cluster string, lane int) *Stats {
	sc := "cluster." + cluster + "."
	return &Stats{
		store:   st,
		cluster: cluster,
		lane:    lane,

		CxTotal:       st.Counter(sc + "upstream_cx_total").Lane(lane),
		CxActive:      st.Gauge(sc+"upstream_cx_active", stats.GaugeSum).Lane(lane),
		CxConnectFail: st.Counter(sc + "upstream_cx_connect_fail").Lane(lane),
		RqTotal:       st.Counter(sc + "upstream_rq_total").Lane(lane),
		RqTime:        st.Histogram(sc + "upstream_rq_time").Lane(lane),

		CxOverflow:        st.Counter(sc + "upstream_cx_overflow").Lane(lane),
		RqPendingOverflow: st.Counter(sc + "upstream_rq_pending_overflow").Lane(lane),
		LBHealthyPanic:    st.Counter(sc + "lb_healthy_panic").Lane(lane),
		RqRetry:           st.Counter(sc + "upstream_rq_retry").Lane(lane),
		RqRetrySuccess:    st.Counter(sc + "upstream_rq_retry_success").Lane(lane),
	}
}

// SetMembership sets cluster.<name>.membership_total and
// membership_healthy (gauges, newest generation) on lane 0: the main
// goroutine calls it when it publishes a snapshot, and the cluster's
// Monitor whenever the host set changes. Healthy counts the endpoints
// that are healthy and not ejected (0 in panic mode).
func (c *Cluster) SetMembership(st *stats.Store) {
	n := int64(len(c.Endpoints))
	healthy := n
	if c.state != nil {
		healthy = int64(c.state.hosts.Load().Usable())
	}
	sc := "cluster." + c.Name + "."
	st.Gauge(sc+"membership_total", stats.GaugeNewest).Lane(0).Set(n)
	st.Gauge(sc+"membership_healthy", stats.GaugeNewest).Lane(0).Set(healthy)
}

// BindStats makes the view count into s (nil: count nothing). Safe to call
// while the view is in use; a connection keeps the handles it was opened
// with, so its close is counted where its open was.
//
// A TLS cluster's view also counts cluster.<name>.ssl.*, which clusters
// without TLS do not have: s is copied with them added.
func (wc *WorkerCluster) BindStats(s *Stats) {
	if s != nil && wc.tls != nil && s.ssl == nil && s.store != nil {
		withSSL := *s
		withSSL.ssl = newSSLStats(s.store, s.cluster, s.lane)
		s = &withSSL
	}
	wc.stats.Store(s)
}

// Stats returns the handles the view counts into, or nil.
func (wc *WorkerCluster) Stats() *Stats { return wc.stats.Load() }

// dialed counts the outcome of one connect and returns the connection to
// use: c wrapped so that its close is counted once (and gives back its
// slot of brk's max_connections, which the caller took), or nil.
func (wc *WorkerCluster) dialed(c net.Conn, err error, brk *breakers) net.Conn {
	s := wc.stats.Load()
	if err != nil {
		if s != nil {
			s.CxConnectFail.Inc()
		}
		return nil
	}
	if s == nil && brk == nil {
		return c
	}
	cc := &countedConn{Conn: c, brk: brk}
	if s != nil {
		s.CxTotal.Inc()
		s.CxActive.Inc()
		cc.active, cc.counted = s.CxActive, true
	}
	return cc
}

// countedConn is an upstream connection counted in upstream_cx_active
// (when counted) and in its cluster's max_connections (when brk is set)
// until its first Close.
type countedConn struct {
	net.Conn
	active  stats.GaugeLane
	counted bool
	brk     *breakers
	closed  atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		if c.counted {
			c.active.Dec()
		}
		if c.brk != nil {
			c.brk.connections.n.Add(-1)
		}
	}
	return c.Conn.Close()
}

// TCPConn is the socket under the counting, for splice(2): a copy between
// two *net.TCPConn never enters user space.
func (c *countedConn) TCPConn() *net.TCPConn {
	tc, _ := c.Conn.(*net.TCPConn)
	return tc
}

// CloseWrite half-closes the connection (TCP proxying forwards an EOF).
func (c *countedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// msSince is the time since start in milliseconds, for histograms.
func msSince(start time.Time) float64 {
	return float64(time.Since(start)) / float64(time.Millisecond)
}

// CountRetry counts a retry of a request (retry_on), in
// upstream_rq_retry.
func (wc *WorkerCluster) CountRetry() {
	if st := wc.stats.Load(); st != nil {
		st.RqRetry.Inc()
	}
}

// CountRetrySuccess counts a retried request whose last try got a
// response that was not retried, in upstream_rq_retry_success.
func (wc *WorkerCluster) CountRetrySuccess() {
	if st := wc.stats.Load(); st != nil {
		st.RqRetrySuccess.Inc()
	}
}

// RecordRequest counts one request sent to the cluster and, once its
// response head has arrived (ok), the time it took.
func (wc *WorkerCluster) RecordRequest(start time.Time, ok bool) {
	st := wc.stats.Load()
	if st == nil {
		return
	}
	st.RqTotal.Inc()
	if ok {
		st.RqTime.Record(msSince(start))
	}
}
